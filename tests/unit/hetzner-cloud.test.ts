import { createServer } from "node:net";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { type CreateMachine, type ProviderContext, ProviderError, type ProviderErrorKind, type ProviderSession } from "../../core/pools/provider/contract.ts";
import type { ProviderEmulator } from "../../providers/emulator.ts";
import { startHetznerEmulator } from "../../providers/hetzner-cloud/emulator.ts";
import { hetznerCloud } from "../../providers/hetzner-cloud/index.ts";
import { firstHost } from "../../providers/hetzner-cloud/shapes.ts";

const MANAGED = "bc-test";
const KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFvAaFx3RZ1mY7Jq2l8bq9C7cA9Zq3N1f0bq7xJmGx2k alice@laptop";
const KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB3e7u2Yw1Yk9oV0mJ9w5b0h6p1z3qT9r8m2Lw4sXc7f bob";

let emu: ProviderEmulator;
beforeEach(async () => {
  emu = await startHetznerEmulator({ actionMs: 30 });
});
afterEach(() => emu.close());

const connect = (ctx: Partial<ProviderContext> = {}, config: Record<string, unknown> = {}): ProviderSession =>
  hetznerCloud.connect({ ...emu.config, ...config }, { credential: async (name) => emu.credentials[name] ?? "", managedBy: MANAGED, ...ctx });

const machineFor = (instanceId: string, over: Partial<CreateMachine> = {}): CreateMachine => ({
  instanceId,
  name: `vm-${instanceId}`,
  offer: "cx22",
  image: "ubuntu-24.04",
  sshKeys: [],
  userData: null,
  start: true,
  ...over,
});

/** Polls until `ok` holds, failing after `ms`: waits on a condition, never for a fixed time. */
async function until<T>(probe: () => Promise<T> | T, ok: (v: T) => boolean, ms = 3000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (ok(v)) return v;
    if (Date.now() > deadline) throw new Error(`condition not met within ${ms} ms; last: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function failure(p: Promise<unknown>): Promise<ProviderError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(ProviderError);
  return e as ProviderError;
}

/** An endpoint where nothing listens: a port just given back. */
async function closedEndpoint(): Promise<string> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const { port } = srv.address() as { port: number };
  await new Promise((r) => srv.close(r));
  return `http://127.0.0.1:${port}/v1`;
}

const api = (path: string, init: RequestInit = {}) =>
  fetch(emu.url + path, { ...init, headers: { Authorization: `Bearer ${emu.credentials.token}`, "Content-Type": "application/json" } });

describe("hetzner-cloud account config", () => {
  it("takes an endpoint and a location, and no secret", () => {
    expect(hetznerCloud.accountConfig.safeParse({ endpoint: "https://api.example/v1", location: "fsn1" }).success).toBe(true);
    expect(hetznerCloud.accountConfig.safeParse({}).success).toBe(true);
    expect(hetznerCloud.accountConfig.safeParse({ token: "x" }).success).toBe(false);
    expect(hetznerCloud.accountConfig.safeParse({ endpoint: "not a url" }).success).toBe(false);
    expect(hetznerCloud.credentials).toEqual(["token"]);
  });
});

describe("hetzner-cloud session against the emulator", () => {
  it("offers the server types sold, without deprecated ones, per location", async () => {
    const all = await connect().offers();
    expect(all).toContainEqual({ name: "cx22", vcpus: 2, memoryMib: 4096, diskGib: 40 });
    expect(all.map((o) => o.name).sort()).toEqual(["cpx11", "cx22", "cx32", "cx42"]);
    const hel1 = await connect({}, { location: "hel1" }).offers();
    expect(hel1.map((o) => o.name).sort()).toEqual(["cx22", "cx32"]);
  });

  it("creates a machine that reaches running, with its addresses and labels", async () => {
    const s = connect();
    const m = await s.create(machineFor("i1", { sshKeys: [KEY_A, KEY_B], userData: "#cloud-config\n" }));
    expect(m).toMatchObject({ instanceId: "i1", status: "creating" });
    const up = await until(
      () => s.get(m.externalId),
      (x) => x?.status === "running",
    );
    expect(up?.addresses[0]).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    expect(up?.addresses[1]).toMatch(/::1$/);
    expect(emu.machines()).toEqual([expect.objectContaining({ externalId: m.externalId, instanceId: "i1", managedBy: MANAGED, status: "running" })]);
  });

  it("registers each SSH key once, and uses a key someone registered under another name", async () => {
    const s = connect();
    await api("/ssh_keys", { method: "POST", body: JSON.stringify({ name: "bobs-laptop", public_key: KEY_B }) });
    await s.create(machineFor("k1", { sshKeys: [KEY_A, KEY_B] }));
    await s.create(machineFor("k2", { sshKeys: [`${KEY_A.split(" ").slice(0, 2).join(" ")} other-comment`] }));
    const { ssh_keys } = (await (await api("/ssh_keys")).json()) as { ssh_keys: { name: string }[] };
    expect(ssh_keys.map((k) => k.name).sort()).toEqual([expect.stringMatching(/^bc-[0-9a-f]{40}$/), "bobs-laptop"]);
    expect(emu.machines()).toHaveLength(2);
  });

  it("creates powered off when asked, then starts and stops, doing nothing when already there", async () => {
    const s = connect();
    const m = await s.create(machineFor("p1", { start: false }));
    await until(
      () => s.get(m.externalId),
      (x) => x?.status === "stopped",
    );
    await s.start(m.externalId);
    await until(
      () => s.get(m.externalId),
      (x) => x?.status === "running",
    );
    let before = emu.requests();
    await s.start(m.externalId);
    expect(emu.requests() - before).toBe(1); // the look, no poweron
    await s.stop(m.externalId);
    await until(
      () => s.get(m.externalId),
      (x) => x?.status === "stopped",
    );
    before = emu.requests();
    await s.stop(m.externalId);
    expect(emu.requests() - before).toBe(1);
  });

  it("makes one server however often create is called for an instance", async () => {
    const s = connect();
    const first = await s.create(machineFor("c1"));
    const again = await s.create(machineFor("c1"));
    const racing = await Promise.all([s.create(machineFor("c2")), s.create(machineFor("c2"))]);
    expect(again.externalId).toBe(first.externalId);
    expect(racing[0].externalId).toBe(racing[1].externalId);
    expect(emu.createdPerInstance()).toEqual(
      new Map([
        ["c1", 1],
        ["c2", 1],
      ]),
    );
  });

  it("adopts its own server when a re-sent POST meets uniqueness_error", async () => {
    // As a retrying HTTP layer does after a lost answer: the first POST made the server, the repeat gets 409.
    let posts = 0;
    const resending: typeof fetch = async (input, init) => {
      if (init?.method === "POST" && String(input).endsWith("/servers") && posts++ === 0) await fetch(input, init);
      return fetch(input, init);
    };
    const m = await connect({ fetch: resending }).create(machineFor("u1"));
    expect(posts).toBe(1);
    expect(emu.machines()).toEqual([expect.objectContaining({ externalId: m.externalId, instanceId: "u1" })]);
    expect(emu.createdPerInstance().get("u1")).toBe(1);
  });

  it("refuses a name held by a server that is not the instance's", async () => {
    await emu.plant("someone-else", MANAGED);
    const taken = emu.machines()[0]!.name;
    const e = await failure(connect().create(machineFor("n1", { name: taken })));
    expect(e).toMatchObject({ kind: "invalid", code: "uniqueness_error" });
    expect(emu.machines()).toHaveLength(1);
  });

  it("finds by instance label (the oldest) and lists its own machines over many pages", async () => {
    const s = connect();
    const ids: string[] = [];
    for (let i = 0; i < 60; i++) ids.push(await emu.plant(`inst${i}`, MANAGED));
    await emu.plant("foreign", "another-deployment");
    const twin = await emu.plant("inst7", MANAGED);
    const listed = await s.list();
    expect(listed).toHaveLength(61);
    expect(new Set(listed.map((m) => m.externalId))).toEqual(new Set([...ids, twin]));
    expect((await s.find("inst55"))?.externalId).toBe(ids[55]);
    expect((await s.find("inst7"))?.externalId).toBe(ids[7]);
    expect(await s.find("nobody")).toBeNull();
  });

  it("deletes idempotently; a deleted machine reads as null", async () => {
    const s = connect();
    const m = await s.create(machineFor("d1"));
    await until(
      () => s.get(m.externalId),
      (x) => x?.status === "running",
    );
    await s.delete(m.externalId);
    await s.delete(m.externalId); // while the first delete still runs: the server is locked
    expect((await s.get(m.externalId))?.status ?? "gone").toMatch(/deleting|gone/);
    await until(
      () => s.get(m.externalId),
      (x) => x === null,
    );
    await s.delete(m.externalId);
    await s.delete("not-an-id");
    expect(await s.get("999999")).toBeNull();
    expect(await s.get("abc")).toBeNull();
  });

  it("notices machines changed behind its back", async () => {
    const s = connect();
    const id = await emu.plant("b1", MANAGED);
    emu.powerOffBehindBack(id);
    expect((await s.get(id))?.status).toBe("stopped");
    emu.destroyBehindBack(id);
    expect(await s.get(id)).toBeNull();
  });
});

describe("hetzner-cloud errors", () => {
  const cases: [ProviderErrorKind, string, number][] = [
    ["capacity", "resource_unavailable", 412],
    ["quota", "resource_limit_exceeded", 403],
    ["auth", "unauthorized", 401],
    ["invalid", "invalid_input", 422],
    ["transient", "unavailable", 503],
  ];
  it.each(cases)("classifies an injected %s failure on create", async (kind, code, status) => {
    emu.failNext("create", kind);
    const e = await failure(connect().create(machineFor("e1")));
    expect(e).toMatchObject({ kind, code });
    expect(e.message).toMatch(new RegExp(`^hetzner-cloud: POST /servers failed: ${code} \\(${status}\\): \\S`));
    expect(emu.machines()).toHaveLength(0);
  });

  it("classifies failures of every operation", async () => {
    const s = connect();
    const id = await emu.plant("o1", MANAGED);
    const calls: [Parameters<ProviderEmulator["failNext"]>[0], () => Promise<unknown>][] = [
      ["get", () => s.get(id)],
      ["list", () => s.list()],
      ["list", () => s.find("o1")],
      ["stop", () => s.stop(id)],
      ["delete", () => s.delete(id)],
    ];
    for (const [op, call] of calls) {
      emu.failNext(op, "transient");
      expect(await failure(call())).toMatchObject({ kind: "transient", code: "unavailable" });
    }
    emu.failNext("any", "quota", 2);
    expect((await failure(s.offers())).kind).toBe("quota");
    expect((await failure(s.get(id))).kind).toBe("quota");
    expect((await s.get(id))?.externalId).toBe(id);
    emu.failRandomly(1);
    expect(await failure(s.list())).toMatchObject({ kind: "transient", code: "unavailable" });
    emu.failRandomly(0);
    expect(await s.list()).toHaveLength(1);
  });

  it("honours the rate limit: 429 is transient with a delay, and nothing is sent while the budget is spent", async () => {
    emu.rateLimit(3, 60_000);
    const a = connect();
    for (let i = 0; i < 3; i++) await a.get("42");
    expect(a.pace()).toBeGreaterThan(10_000);
    let sent = emu.requests();
    const local = await failure(a.get("42"));
    expect(local).toMatchObject({ kind: "transient", code: "rate_limit_exceeded" });
    expect(emu.requests()).toBe(sent);

    const b = connect();
    const refused = await failure(b.list());
    expect(refused).toMatchObject({ kind: "transient", code: "rate_limit_exceeded" });
    expect(refused.retryAfterMs).toBeGreaterThan(10_000);
    expect(refused.retryAfterMs).toBeLessThanOrEqual(21_000);
    expect(emu.rateLimited()).toBe(1);
    sent = emu.requests();
    await failure(b.list());
    expect(emu.requests()).toBe(sent);
  });

  it("asks again once the budget has refilled", async () => {
    emu.rateLimit(2, 200);
    const s = connect();
    await s.get("1");
    await s.get("1");
    expect(s.pace()).toBeGreaterThan(0);
    await until(
      () => s.pace(),
      (ms) => ms === 0,
    );
    expect(await s.get("1")).toBeNull();
    expect(emu.rateLimited()).toBe(0);
  });

  it("hands a spent budget's refills to waiting calls in turn: none fails, none earns a 429", async () => {
    emu.rateLimit(5, 500);
    const s = connect();
    for (let i = 0; i < 5; i++) await s.get("1");
    expect(s.pace()).toBeGreaterThan(0);
    const sent = emu.requests();
    // Five more at once: one refill each (100 ms here, up to 300 ms as the whole-second reset header lets the
    // client reckon it), inside the two seconds a call waits for its turn.
    const answers = await Promise.all(
      Array.from({ length: 5 }, () =>
        s.get("1").then(
          () => "ok",
          (e: ProviderError) => e.code,
        ),
      ),
    );
    expect(answers).toEqual(Array(5).fill("ok"));
    expect(emu.requests() - sent).toBe(5);
    expect(emu.rateLimited()).toBe(0);
  });

  it("calls a wrong token auth and never shows the token", async () => {
    const wrong = "w".repeat(64);
    const e = await failure(connect({ credential: async () => wrong }).offers());
    expect(e).toMatchObject({ kind: "auth", code: "unauthorized" });
    expect(e.message).not.toContain(wrong);
    const broken = `${emu.credentials.token}\nX-Evil: 1`;
    const header = await failure(connect({ credential: async () => broken }).offers());
    expect(header.kind).toBe("auth");
    expect(`${header.message}${header.stack}`).not.toContain(emu.credentials.token);
    const missing = await failure(
      connect({
        credential: async () => {
          throw new Error("env:HCLOUD_TOKEN is not set");
        },
      }).offers(),
    );
    expect(missing.kind).toBe("auth");
  });

  it("keeps the token out of every error", async () => {
    const token = emu.credentials.token!;
    const s = connect();
    const errors: ProviderError[] = [];
    for (const [kind] of cases) {
      emu.failNext("any", kind);
      errors.push(await failure(s.offers()));
    }
    const echoing: typeof fetch = async () => Response.json({ error: { code: "invalid_input", message: `bad token ${token}` } }, { status: 422 });
    errors.push(await failure(connect({ fetch: echoing }).list()));
    errors.push(await failure(connect({}, { endpoint: await closedEndpoint() }).offers()));
    emu.rateLimit(1, 60_000);
    await s.offers();
    errors.push(await failure(s.offers()));
    errors.push(await failure(connect().offers()));
    for (const e of errors) expect(JSON.stringify({ m: e.message, s: e.stack, e })).not.toContain(token);
  });

  it("treats network failures, timeouts, broken answers and failed actions as transient", async () => {
    expect(await failure(connect({}, { endpoint: await closedEndpoint() }).get("1"))).toMatchObject({ kind: "transient", code: "ECONNREFUSED" });
    const timingOut: typeof fetch = async () => {
      throw new DOMException("The operation was aborted due to timeout", "TimeoutError");
    };
    expect(await failure(connect({ fetch: timingOut }).get("1"))).toMatchObject({ kind: "transient", code: "timeout" });
    const html: typeof fetch = async () => new Response("<html>bad gateway</html>", { status: 502 });
    expect((await failure(connect({ fetch: html }).list())).kind).toBe("transient");
    const bare404: typeof fetch = async () => new Response("Not Found", { status: 404 });
    expect((await failure(connect({ fetch: bare404 }).get("1"))).kind).toBe("transient");
    const notJson: typeof fetch = async () => new Response("ok", { status: 200 });
    expect((await failure(connect({ fetch: notJson }).list())).kind).toBe("transient");
    const failedAction: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      if (!String(input).endsWith("/poweroff")) return res;
      const { action } = (await res.json()) as { action: Record<string, unknown> };
      return Response.json({ action: { ...action, status: "error", error: { code: "action_failed", message: "power off failed" } } }, { status: 201 });
    };
    const id = await emu.plant("a1", MANAGED);
    expect(await failure(connect({ fetch: failedAction }).stop(id))).toMatchObject({ kind: "transient", code: "action_failed" });
  });
});

describe("hetzner-cloud emulator", () => {
  it("pages with exactly the documented keys and filters by label selectors", async () => {
    for (let i = 0; i < 3; i++) await emu.plant(`s${i}`, i === 0 ? "x" : "y");
    const page = (await (await api("/servers?per_page=2&page=2")).json()) as { servers: unknown[]; meta: { pagination: Record<string, unknown> } };
    expect(page.meta.pagination).toEqual({ page: 2, per_page: 2, previous_page: 1, next_page: null, last_page: 2, total_entries: 3 });
    const count = async (selector: string) =>
      ((await (await api(`/servers?label_selector=${encodeURIComponent(selector)}`)).json()) as { servers: unknown[] }).servers.length;
    expect(await count("bc-managed-by==y")).toBe(2);
    expect(await count("bc-managed-by=x")).toBe(1);
    expect(await count("bc-managed-by!=x,bc-instance")).toBe(2);
    expect(await count("!bc-instance")).toBe(0);
    expect(await count("bc-instance in (s0,s2)")).toBe(2);
  });

  it("moves actions along, locks the server meanwhile, and answers in the documented shapes", async () => {
    const res = await api("/servers", { method: "POST", body: JSON.stringify({ name: "raw", server_type: "cx22", image: "debian-12", location: "nbg1" }) });
    expect(res.status).toBe(201);
    expect(res.headers.get("ratelimit-limit")).toBe("3600");
    const body = (await res.json()) as Record<string, { id: number; status?: string } & Record<string, unknown>>;
    expect(Object.keys(body).sort()).toEqual(["action", "next_actions", "root_password", "server"]);
    expect(body.server?.status).toBe("initializing");
    expect(body.server?.public_net).toMatchObject({ ipv4: { id: expect.any(Number), blocked: false }, floating_ips: [], firewalls: [] });
    expect((await api(`/servers/${body.server?.id}/actions/poweroff`, { method: "POST" })).status).toBe(423);
    const done = await until(
      async () => ((await (await api(`/actions/${body.action?.id}`)).json()) as { action: { status: string; progress: number } }).action,
      (a) => a.status === "success",
    );
    expect(done.progress).toBe(100);
    expect((await api("/actions")).status).toBe(400);
    expect((await api("/servers", { method: "POST", body: JSON.stringify({ name: "raw", server_type: "cx22", image: "debian-12" }) })).status).toBe(409);
    expect((await api("/servers", { method: "POST", body: JSON.stringify({ name: "x2", server_type: "cx99", image: "debian-12" }) })).status).toBe(422);
    expect((await fetch(`${emu.url}/servers`)).status).toBe(401);
  });
});

describe("hetzner-cloud addresses", () => {
  it("reaches a server on the first address of its IPv6 network", () => {
    expect(firstHost("2001:db8:1::/64")).toBe("2001:db8:1::1");
    expect(firstHost("2a01:4f8:c012:abcd::/64")).toBe("2a01:4f8:c012:abcd::1");
    expect(firstHost("2a01:4f8:1:2:0:0:0:0/64")).toBe("2a01:4f8:1:2::1");
  });
});
