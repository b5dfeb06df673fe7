import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { promisify } from "node:util";
import { type Browser, chromium } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Harness, startHarness } from "../support/harness.ts";

/**
 * GraphiQL on GET /graphql shares the dashboard's origin, where the dashboard keeps its token: it must load
 * nothing from another host, and its page carries the dashboard's policy and frame rules.
 */
const CHROMIUM = process.env.CHROMIUM_PATH ?? ["/usr/lib/chromium/chromium", "/usr/bin/chromium"].find((p) => existsSync(p)) ?? "/usr/bin/chromium";

let h: Harness;
let browser: Browser;
beforeAll(async () => {
  await promisify(execFile)(process.execPath, ["scripts/build-web.mjs"]);
  h = await startHarness();
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--disable-background-networking", "--disable-component-update"] });
}, 120_000);
afterAll(async () => {
  await browser?.close();
  await h?.close();
});

describe("GraphiQL", () => {
  it("runs a query from files of this origin alone, under the dashboard's script, connection and frame rules", async () => {
    const res = await fetch(h.url, { headers: { accept: "text/html" } });
    const csp = res.headers.get("content-security-policy") ?? "";
    for (const rule of ["script-src 'self'", "connect-src 'self'", "default-src 'self'", "frame-ancestors 'none'"]) expect(csp).toContain(rule);
    expect(res.headers.get("x-frame-options")).toBe("DENY");
    expect(await res.text()).not.toMatch(/(src|href)="(https?:)?\/\//);

    const page = await browser.newPage({ extraHTTPHeaders: {} });
    const origins = new Set<string>();
    const errors: string[] = [];
    page.on("request", (r) => origins.add(new URL(r.url()).origin));
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(h.url);
    const run = page.locator(".graphiql-execute-button");
    await run.waitFor({ timeout: 20_000 });
    // An anonymous request: introspection is refused to it, which is an answer from this server all the same.
    await expect.poll(async () => ((await page.locator(".graphiql-response").textContent()) ?? "").includes("INVALID_INPUT"), { timeout: 20_000 }).toBe(true);
    expect([...origins]).toEqual([new URL(h.url).origin]);
    expect(errors).toEqual([]);
    await page.close();
  });
});
