import { execFile } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { type Browser, type BrowserContext, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { meterUsage } from "../../core/books/usage.ts";
import {
  CreateInstanceDocument,
  CreateNodeDocument,
  CreatePoolDocument,
  CreateSandboxTemplateDocument,
  InstanceDocument,
  StartInstanceDocument,
} from "../../sdk/client.ts";
import { until } from "../support/fixtures.ts";
import { type Hosts, startHosts } from "../support/hosts.ts";

/**
 * The dashboard in a real browser (Debian's Chromium through playwright-core) against the real server on
 * simulated hosts. Every change is watched for on the open page, and the page must never have loaded twice:
 * a view that needs a reload to show a change fails here. Screenshots of the main views go to SCREENSHOT_DIR.
 */
const CHROMIUM = process.env.CHROMIUM_PATH ?? ["/usr/lib/chromium/chromium", "/usr/bin/chromium"].find((p) => existsSync(p)) ?? "/usr/bin/chromium";
const SHOTS = process.env.SCREENSHOT_DIR ?? join("test-results", "screenshots");
const HOUR = 3600_000;

let hosts: Hosts;
let browser: Browser;
let base: string;
// The platform's clock starts three hours back, so an instance made then has hours of usage to chart.
let shift = -3 * HOUR;

beforeAll(async () => {
  await promisify(execFile)(process.execPath, ["scripts/build-web.mjs"]);
  mkdirSync(SHOTS, { recursive: true });
  // Hosts report on the shifted clock: a grace longer than the jump keeps them from going lost when it jumps.
  hosts = await startHosts(2, { NODE_LOST_GRACE_MS: String(24 * HOUR), SANDBOX_SWEEP_MS: "200" }, { now: () => new Date(Date.now() + shift) });
  await Promise.all([hosts.start(0), hosts.start(1)]);
  base = hosts.h.url.replace(/\/graphql$/, "");
  browser = await chromium.launch({ executablePath: CHROMIUM });
}, 120_000);
afterAll(async () => {
  await browser?.close();
  await hosts?.close();
});

/** A page that counts its loads: the tests end by checking it loaded once (no reloads, no navigations away). */
async function open(context: BrowserContext): Promise<Page & { loads: () => number }> {
  const page = await context.newPage();
  let loads = 0;
  page.on("load", () => loads++);
  page.on("pageerror", (e) => console.error("page error:", e));
  await page.goto(`${base}/`);
  return Object.assign(page, { loads: () => loads });
}

async function signIn(page: Page, token: string) {
  await page.getByLabel("API token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Instances", exact: true }).waitFor();
}

const stateOf = (page: Page, testId: string) => page.getByTestId(testId).getByTestId("state").getAttribute("data-state");
const shot = (page: Page, name: string) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });

describe("the dashboard", () => {
  let t: Awaited<ReturnType<Hosts["h"]["tenant"]>>;
  let context: BrowserContext;
  let page: Page & { loads: () => number };
  let created = "";

  beforeAll(async () => {
    t = await hosts.h.tenant({ name: "acme" });
    // Three hours ago: an instance that has run since, metered when the clock catches up.
    const { createInstance: old } = await t.client.request(CreateInstanceDocument, {
      input: { poolId: hosts.poolId, flavor: "medium", imageId: hosts.imageId },
    });
    await until("the old instance running", async () => (await t.client.request(InstanceDocument, { id: old.id })).instance?.state === "RUNNING", 20_000);
    shift = 0;
    await until("usage metered", async () => (await meterUsage((fn) => hosts.h.platform.write({ actor: "usage" }, fn))) === 0, 20_000);
    context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    page = await open(context);
  });
  afterAll(() => context?.close());

  it("refuses a wrong token with its code, and signs in with a right one", async () => {
    await page.getByLabel("API token").fill("bc_not-a-real-token");
    await page.getByRole("button", { name: "Sign in" }).click();
    await expect.poll(() => page.getByRole("alert").getAttribute("data-code")).toBe("UNAUTHENTICATED");
    await shot(page, "sign-in");
    await signIn(page, t.token);
    expect(await page.getByTestId("who").textContent()).toBe(t.id);
  });

  it("creates an instance and shows its badge reach running, and a change made elsewhere, without a reload", async () => {
    const rows = page.locator('tr[data-testid^="instance-"]');
    await expect.poll(() => rows.count()).toBe(1);
    const before = await rows.first().getAttribute("data-testid");
    await page.getByRole("button", { name: "New instance" }).click();
    const form = page.getByRole("form", { name: "new instance" });
    await form.getByLabel("Flavor").selectOption("small");
    await form.getByRole("button", { name: "Create" }).click();
    await expect.poll(() => rows.count()).toBe(2);
    const ids = await rows.evaluateAll((trs) => trs.map((tr) => tr.getAttribute("data-testid") ?? ""));
    created = (ids.find((id) => id !== before) ?? "").replace(/^instance-/, "");
    await expect.poll(() => stateOf(page, `instance-${created}`), { timeout: 20_000 }).toBe("RUNNING");

    // Made by another client: it appears, and its stop shows, on the open page.
    const { createInstance: other } = await t.client.request(CreateInstanceDocument, {
      input: { poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId, desiredState: "STOPPED" },
    });
    await expect.poll(() => stateOf(page, `instance-${other.id}`), { timeout: 20_000 }).toBe("STOPPED");
    await t.client.request(StartInstanceDocument, { id: other.id });
    await expect.poll(() => stateOf(page, `instance-${other.id}`), { timeout: 20_000 }).toBe("RUNNING");
    await shot(page, "instances");
    expect(page.loads()).toBe(1);
  });

  it("stops an instance after asking, and shows every transition with its reason and actor", async () => {
    await page.getByRole("link", { name: created }).click();
    await page.getByRole("heading", { name: created }).waitFor();
    await page.getByRole("button", { name: "Stop" }).click();
    const dialog = page.getByRole("dialog");
    await dialog.getByRole("button", { name: "Stop" }).click();
    await expect.poll(() => page.getByTestId("state").getAttribute("data-state"), { timeout: 20_000 }).toBe("STOPPED");
    const timeline = page.getByTestId("timeline");
    await timeline.locator('li[data-to="STOPPED"]').waitFor();
    const texts = await timeline.locator("li").allTextContents();
    // The request, by the tenant's identity; then what the reconciler made of the host's reports.
    expect(texts.filter((x) => x.includes("requested:stopped") && x.includes(`by ${t.identityId}`))).toHaveLength(1);
    expect(texts[0]).toMatch(/host:stopped.*by reconciler/);
    // Newest first: stopped, stopping, …, the create at the bottom.
    const entries = await timeline.locator("li").evaluateAll((lis) => lis.map((li) => li.getAttribute("data-to")));
    expect(entries[0]).toBe("STOPPED");
    expect(entries.at(-1)).toBe("PENDING");
    expect(entries).toContain("RUNNING");
    await shot(page, "instance");
    expect(page.loads()).toBe(1);
  });

  it("runs a command in a sandbox and streams its output", async () => {
    await t.client.request(CreateSandboxTemplateDocument, {
      input: { name: "python", poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId, ttlSeconds: 600, warm: 1 },
    });
    await page.getByRole("link", { name: "Sandboxes", exact: true }).click();
    await page.getByRole("button", { name: "New sandbox" }).click();
    await expect.poll(() => page.getByTestId("sandbox-state").getAttribute("data-state"), { timeout: 20_000 }).toBe("RUNNING");
    await page.getByLabel("command").fill("echo hello from the sandbox; echo and a warning >&2; exit 3");
    await page.getByRole("button", { name: "Run" }).click();
    const out = page.getByTestId("exec-output");
    await expect.poll(() => out.textContent(), { timeout: 20_000 }).toContain("[exit code 3]");
    expect(await out.locator(".stdout").allTextContents()).toEqual(["hello from the sandbox\n"]);
    expect(await out.locator(".stderr").allTextContents()).toEqual(["and a warning\n"]);
    await shot(page, "sandbox-exec");
    await page.getByRole("link", { name: "Sandboxes", exact: true }).click();
    await page.getByTestId("template-python").waitFor();
    await shot(page, "sandboxes");
    expect(page.loads()).toBe(1);
  });

  it("charts usage over time", async () => {
    await page.getByRole("link", { name: "Usage", exact: true }).click();
    const bars = page.getByTestId("usage-chart").locator("rect.chart-bar");
    await expect.poll(() => bars.count()).toBe(24);
    const heights = await bars.evaluateAll((rs) => rs.map((r) => Number(r.getAttribute("height"))));
    expect(heights.filter((h) => h > 0).length).toBeGreaterThanOrEqual(3);
    expect(await page.getByRole("tab", { name: "vps.vcpu.hours" }).count()).toBe(1);
    await shot(page, "usage");
  });

  it("fits a phone: no view wider than its screen", async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    // Each view once its content is in, so what is measured is what a person sees.
    const views = { Instances: 'tr[data-testid^="instance-"]', Sandboxes: 'tr[data-testid^="sandbox-"]', Usage: "rect.chart-bar" };
    for (const [view, content] of Object.entries(views)) {
      await page.getByRole("link", { name: view, exact: true }).click();
      await page.locator(content).first().waitFor({ state: "attached" });
      const wide = await page.evaluate(() =>
        [...document.querySelectorAll("main *")]
          .filter((e) => e.getBoundingClientRect().right > innerWidth + 1)
          .map((e) => `${e.tagName.toLowerCase()}.${e.className} ${Math.round(e.getBoundingClientRect().right)}px`),
      );
      expect(await page.evaluate(() => document.documentElement.scrollWidth), `${view}: ${wide.slice(0, 5).join(", ")}`).toBeLessThanOrEqual(390);
    }
    await page.getByRole("link", { name: "Instances", exact: true }).click();
    await shot(page, "instances-phone");
    await page.setViewportSize({ width: 1280, height: 800 });
    expect(page.loads()).toBe(1);
  });
});

describe("the dashboard for operators", () => {
  it("shows pools with address use, hosts with capacity and report age, and the doctor's findings", async () => {
    // A host that joined no agent and has no capacity: the doctor names it.
    await hosts.h.operator.request(CreateNodeDocument, { input: { poolId: hosts.poolId, name: "rack-9", capacity: { vcpus: 0, memoryMib: 0, diskGib: 0 } } });
    await hosts.h.operator.request(CreatePoolDocument, { input: { name: "edge", class: "VPS_HOST", ipv4Range: "10.90.0.0/24" } });
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await open(context);
    await signIn(page, hosts.h.operatorToken);
    expect(await page.getByTestId("who").textContent()).toBe("operator");

    await page.getByRole("link", { name: "Pools & hosts", exact: true }).click();
    const ipam = page.getByTestId("ipam-sim").getByRole("meter");
    await expect.poll(async () => Number(await ipam.getAttribute("aria-valuenow"))).toBeGreaterThanOrEqual(4);
    const host = page.getByTestId("host-host-1");
    await host.waitFor();
    expect(await host.textContent()).toMatch(/last report \d+s ago/);
    const allocated = await page
      .locator('[data-testid^="host-host-"]')
      .getByRole("meter", { name: "vCPU" })
      .evaluateAll((ms) => ms.map((m) => Number(m.getAttribute("aria-valuenow"))));
    expect(allocated).toHaveLength(2);
    expect(allocated.reduce((a, b) => a + b)).toBeGreaterThan(0);
    await page.getByTestId("ipam-edge").waitFor();
    await shot(page, "fleet");

    await page.getByRole("link", { name: "Doctor", exact: true }).click();
    const finding = page.getByTestId("finding-vps.hosts.capacity");
    await finding.waitFor();
    expect(await finding.textContent()).toContain("Fix:");
    await shot(page, "doctor");

    await page.getByRole("link", { name: "Warm pools", exact: true }).click();
    await page.getByTestId("template-python").waitFor();
    await page.getByRole("link", { name: "Instances", exact: true }).click();
    await until("every tenant's instances listed", async () => (await page.locator('tr[data-testid^="instance-"]').count()) >= 3);
    await shot(page, "operator-instances");
    expect(page.loads()).toBe(1);
    await context.close();
  });
});
