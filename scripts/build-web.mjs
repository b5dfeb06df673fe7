// Builds the dashboard (web/) into web/dist, which the server serves at `/`. `npm start` and `npm run build`
// run it; the browser test runs it too. Vite is a development dependency: a production install takes the
// bundle from `npm run build`'s dist/ instead.
//
// GraphiQL (served on GET /graphql) comes along: its prebuilt bundle from the development dependency
// @graphql-yoga/graphiql, and our boot script, copied into web/dist/graphiql so the page loads nothing from
// another host (server/dashboard.ts serves it under the dashboard's Content-Security-Policy).
import { cpSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { build } from "vite";

await build({ configFile: new URL("../web/vite.config.ts", import.meta.url).pathname, logLevel: "warn" });

const out = new URL("../web/dist/graphiql/", import.meta.url).pathname;
const dist = join(dirname(createRequire(import.meta.url).resolve("@graphql-yoga/graphiql/package.json")), "dist");
mkdirSync(out, { recursive: true });
cpSync(new URL("../web/graphiql/boot.js", import.meta.url).pathname, join(out, "boot.js"));
for (const [from, to] of [
  ["graphiql.css", "graphiql.css"],
  ["yoga-graphiql.umd.js", "graphiql.js"],
  ["monacoeditorwork/editor.worker.bundle.js", "editor.worker.js"],
  ["monacoeditorwork/json.worker.bundle.js", "json.worker.js"],
  ["monacoeditorwork/graphql.worker..bundle.js", "graphql.worker.js"],
])
  cpSync(join(dist, from), join(out, to));
