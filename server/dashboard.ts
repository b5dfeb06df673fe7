import { createReadStream } from "node:fs";
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
// browser is out of reach of injected script, and the page cannot be framed.
const CSP = "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; base-uri 'none'";

const NOT_BUILT = `<!doctype html><meta charset="utf-8"><title>Better Compute</title>
<p>The dashboard is not built in this checkout: run <code>npm run build</code> (or <code>npm start</code>, which builds it).
The API is at <a href="/graphql">/graphql</a>.</p>\n`;

/**
 * Serves the dashboard: `/` is its page (never cached, so a new build shows at once), `/assets/*` its bundle
 * (content-hashed names, cached for a year). Anything else is not the dashboard's: returns false.
 */
export function dashboard(dir: string) {
  const root = resolve(dir);
  const send = async (req: IncomingMessage, res: ServerResponse, file: string, cache: string) => {
    const info = await stat(file).catch(() => null);
    if (!info?.isFile()) return false;
    res.writeHead(200, {
      "content-type": TYPES[extname(file)] ?? "application/octet-stream",
      "content-length": info.size,
      "cache-control": cache,
      "x-content-type-options": "nosniff",
      ...(file.endsWith(".html") ? { "content-security-policy": CSP, "referrer-policy": "no-referrer" } : {}),
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
    if (!path.startsWith("/assets/")) return false;
    let file: string;
    try {
      file = resolve(root, `.${decodeURIComponent(path)}`);
    } catch {
      return false; // malformed escapes: not a file of ours
    }
    // Only files under the bundle's folder: `..` and encoded slashes cannot climb out of it.
    if (!file.startsWith(root + sep)) return false;
    return send(req, res, file, "public, max-age=31536000, immutable");
  };
}
