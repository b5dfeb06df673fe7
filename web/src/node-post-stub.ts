/** Stands in for sdk/node-post.ts in the browser bundle (web/vite.config.ts): the SDK uses fetch in a browser. */
export function post(): never {
  throw new Error("node-post is for Node; the browser uses fetch");
}
