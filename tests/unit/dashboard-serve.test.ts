import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dashboard } from "../../server/dashboard.ts";

/** The dashboard's file server on a planted bundle: what it serves, with which headers, and what it never does. */
let server: Server;
let base: string;
const root = mkdtempSync(join(tmpdir(), "bc-dashboard-"));
writeFileSync(join(root, "secret.txt"), "outside the bundle\n");
const bundle = join(root, "dist");
mkdirSync(join(bundle, "assets"), { recursive: true });
writeFileSync(join(bundle, "index.html"), "<!doctype html><title>dash</title>\n");
writeFileSync(join(bundle, "assets", "app-abc123.js"), "console.log(1)\n");

const serve = (dir: string) => {
  const site = dashboard(dir);
  return createServer(async (req, res) => {
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    if (!(await site(req, res, path))) res.writeHead(404).end("not the dashboard's\n");
  });
};

beforeAll(async () => {
  server = serve(bundle);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

describe("the dashboard's files", () => {
  it("serves the page uncached under a strict CSP, and the bundle cached for good", async () => {
    const page = await fetch(`${base}/`);
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(page.headers.get("cache-control")).toBe("no-cache");
    expect(page.headers.get("content-security-policy")).toContain("script-src 'self'");
    expect(page.headers.get("content-security-policy")).toContain("frame-ancestors 'none'");
    expect(await page.text()).toContain("<title>dash</title>");
    const js = await fetch(`${base}/assets/app-abc123.js`);
    expect(js.headers.get("content-type")).toBe("text/javascript; charset=utf-8");
    expect(js.headers.get("cache-control")).toContain("immutable");
    expect(js.headers.get("x-content-type-options")).toBe("nosniff");
    const head = await fetch(`${base}/assets/app-abc123.js`, { method: "HEAD" });
    expect(head.headers.get("content-length")).toBe("15");
  });

  it("serves nothing outside the bundle, whatever the path says, and leaves other paths and methods alone", async () => {
    for (const path of [
      "/assets/../secret.txt",
      "/assets/%2e%2e/%2e%2e/secret.txt",
      "/assets/..%2f..%2fsecret.txt",
      "/assets/%E0%A4%A",
      "/assets/missing.js",
      "/secret.txt",
    ]) {
      const res = await fetch(`${base}${path}`);
      expect(await res.text(), path).not.toContain("outside the bundle");
      expect(res.status, path).toBe(404);
    }
    expect((await fetch(`${base}/`, { method: "POST" })).status).toBe(404);
  });

  it("says how to build it where it is not built, rather than failing", async () => {
    const bare = serve(join(root, "nothing-here"));
    await new Promise<void>((r) => bare.listen(0, "127.0.0.1", r));
    try {
      const res = await fetch(`http://127.0.0.1:${(bare.address() as AddressInfo).port}/`);
      expect(res.status).toBe(200);
      expect(await res.text()).toContain("npm run build");
    } finally {
      await new Promise<void>((r) => bare.close(() => r()));
    }
  });
});
