import { createReadStream, existsSync } from "node:fs";
import { stat } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { extname, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

/** Where `npm run build` (and `npm start`) put the dashboard's bundle: web/dist beside this folder's parent. */
export const defaultDashboardDir = fileURLToPath(new URL("../web/dist", import.meta.url));

const TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".json": "application/json",
  ".woff2": "font/woff2",
};

// The page runs only our own bundle and talks only to this origin (HTTP and websocket): a token kept in the
// browser is out of reach of injected script, and the page cannot be framed. GraphiQL's page, on the same
// origin, carries the same policy (its editor's font is a data: URL, its workers are files of ours) but for one
// word: its editor (Monaco) lays out every line with a style attribute, so that page allows inline styles.
// Scripts stay ours alone there too, which is what keeps the dashboard's token out of other hands.
const policy = (styles: string) =>
  `default-src 'self'; connect-src 'self'; img-src 'self' data:; font-src 'self' data:; style-src ${styles}; script-src 'self'; worker-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'`;
const pageHeaders = (csp: string) => ({ "content-security-policy": csp, "referrer-policy": "no-referrer", "x-frame-options": "DENY" });
const PAGE_HEADERS = pageHeaders(policy("'self'"));
const GRAPHIQL_HEADERS = pageHeaders(policy("'self' 'unsafe-inline'"));

const NOT_BUILT = `<!doctype html><meta charset="utf-8"><title>Better Compute</title>
<p>The dashboard is not built in this checkout: run <code>npm run build</code> (or <code>npm start</code>, which builds it).
The API is at <a href="/graphql">/graphql</a>.</p>\n`;

/** GraphiQL's page: our boot script and GraphiQL's bundle, both from web/dist/graphiql (scripts/build-web.mjs). */
const GRAPHIQL = (options: string) => `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Better Compute API</title>
<link rel="stylesheet" href="/graphiql/graphiql.css"></head><body id="body" class="no-focus-outline">
<noscript>GraphiQL needs JavaScript.</noscript><div id="root" data-options="${options.replace(/&/g, "&amp;").replace(/"/g, "&quot;")}"></div>
<script src="/graphiql/boot.js"></script><script src="/graphiql/graphiql.js"></script></body></html>\n`;

/**
 * Serves the dashboard: `/` is its page (never cached, so a new build shows at once), `/assets/*` its bundle
 * (content-hashed names, cached for a year), `/graphiql/*` GraphiQL's files, and GraphiQL's page where the server
 * asks for it (`graphiql`). Anything else is not the dashboard's: returns false.
 */
export function dashboard(dir: string) {
  const root = resolve(dir);
  const site = serve(root);
  return Object.assign(site, {
    /** GraphiQL's page for `endpoint`, with the dashboard's policy; a short note when the bundle is not built. */
    graphiql(res: ServerResponse, endpoint: string): void {
      const built = existsSync(join(root, "graphiql", "graphiql.js"));
      const body = built
        ? GRAPHIQL(JSON.stringify({ title: "Better Compute", endpoint, subscriptionsProtocol: "WS" }))
        : NOT_BUILT.replace("The dashboard is", "GraphiQL is");
      res.writeHead(200, { "content-type": "text/html; charset=utf-8", "cache-control": "no-cache", "x-content-type-options": "nosniff", ...GRAPHIQL_HEADERS });
      res.end(body);
    },
  });
}

function serve(root: string) {
  const send = async (req: IncomingMessage, res: ServerResponse, file: string, cache: string) => {
    const info = await stat(file).catch(() => null);
    if (!info?.isFile()) return false;
    res.writeHead(200, {
      "content-type": TYPES[extname(file)] ?? "application/octet-stream",
      "content-length": info.size,
      "cache-control": cache,
      "x-content-type-options": "nosniff",
      ...(file.endsWith(".html") ? PAGE_HEADERS : {}),
    });
    if (req.method === "HEAD") res.end();
    else createReadStream(file).pipe(res);
    return true;
  };
  return async (req: IncomingMessage, res: ServerResponse, path: string): Promise<boolean> => {
    if (req.method !== "GET" && req.method !== "HEAD") return false;
    if (path === "/" || path === "/index.html") {
      if (await send(req, res, join(root, "index.html"), "no-cache")) return true;
      res.writeHead(200, { "content-type": "text/html; charset=utf-8", "cache-control": "no-cache" }).end(NOT_BUILT);
      return true;
    }
    const graphiql = path.startsWith("/graphiql/");
    if (!path.startsWith("/assets/") && !graphiql) return false;
    let file: string;
    try {
      file = resolve(root, `.${decodeURIComponent(path)}`);
    } catch {
      return false; // malformed escapes: not a file of ours
    }
    // Only files under the bundle's folder: `..` and encoded slashes cannot climb out of it.
    if (!file.startsWith(root + sep)) return false;
    // GraphiQL's files keep their names from build to build: cached, but looked at again after an hour.
    return send(req, res, file, graphiql ? "public, max-age=3600" : "public, max-age=31536000, immutable");
  };
}
