import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { instanceId as makeInstanceId } from "../../core/kernel/ids.ts";
import { type CreateMachine, isProviderError, type ProviderContext, type ProviderSession } from "../../core/pools/provider/contract.ts";
import type { ProviderEmulator } from "../../providers/emulator.ts";
import { connectProxmox } from "../../providers/proxmox-ve/client.ts";
import { type ProxmoxConfig, proxmoxConfigSchema } from "../../providers/proxmox-ve/config.ts";
import { startProxmoxEmulator } from "../../providers/proxmox-ve/emulator.ts";
import { proxmoxVe } from "../../providers/proxmox-ve/index.ts";
import { statusOf } from "../../providers/proxmox-ve/vms.ts";

const managedBy = "bc-unit";
let emu: ProviderEmulator;
let config: ProxmoxConfig;
let session: ProviderSession;
/** Every error a session threw, to search for the token secret at the end. */
const thrown: unknown[] = [];

const ctxFor = (over: Partial<ProviderContext> = {}): ProviderContext => ({
  credential: async (name) => emu.credentials[name] as string,
  managedBy,
  ...over,
});
const connect = (over: Partial<ProviderContext> = {}) => connectProxmox(config, ctxFor(over), { pollMs: 10 });

function request(over: Partial<CreateMachine> = {}): CreateMachine {
  const instanceId = makeInstanceId("ten", "caller", randomBytes(8).toString("hex"));
  return {
    instanceId,
    name: `bc-${instanceId.slice(5)}`,
    offer: "small",
    image: "debian-12",
    sshKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB+x/y= me@example.org"],
    userData: null,
    start: true,
    ...over,
  };
}

/** Polls `check` until it returns something other than undefined/false, failing after `ms`. */
async function until<T>(what: string, check: () => Promise<T | undefined | false> | T | undefined | false, ms = 5000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const got = await check();
    if (got !== undefined && got !== false) return got;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const machineStatus = async (s: ProviderSession, id: string) => (await s.get(id))?.status;
const untilStatus = (id: string, want: string, s = session) => until(`VM ${id} ${want}`, async () => (await machineStatus(s, id)) === want);

async function failure(p: Promise<unknown>) {
  try {
    await p;
  } catch (e) {
    thrown.push(e);
    if (!isProviderError(e)) throw e;
    return e;
  }
  throw new Error("expected a ProviderError");
}

/** A raw API call with the emulator's token, for what the session does not show. */
async function raw(method: string, path: string, body?: Record<string, string>) {
  const res = await fetch(`${config.endpoint}${path}`, {
    method,
    headers: { Authorization: `PVEAPIToken=${config.tokenId}=${emu.credentials.tokenSecret}` },
    body: body ? new URLSearchParams(body) : undefined,
  });
  return { status: res.status, reason: res.statusText, body: (await res.json()) as { data: unknown; message?: string; errors?: Record<string, string> } };
}

beforeAll(async () => {
  emu = await startProxmoxEmulator({ actionMs: 25 });
  config = proxmoxConfigSchema.parse(emu.config);
  session = connect();
});
afterAll(async () => {
  await emu?.close();
});

describe("proxmox-ve account config", () => {
  it("accepts the emulator's account and names the credential", () => {
    expect(proxmoxVe.accountConfig.safeParse(emu.config).success).toBe(true);
    expect(proxmoxVe.credentials).toEqual(["tokenSecret"]);
  });
  it("refuses a malformed token id, an endpoint that is not the API base, and no templates", () => {
    for (const bad of [
      { ...emu.config, tokenId: "root@pam" },
      { ...emu.config, endpoint: emu.url },
      { ...emu.config, templates: {} },
      { ...emu.config, vmidRange: { lower: 500, upper: 400 } },
      { ...emu.config, tokenSecret: "x" },
    ])
      expect(proxmoxVe.accountConfig.safeParse(bad).success).toBe(false);
  });
  it("offers the operator's shapes, or a default list", async () => {
    expect((await session.offers()).map((o) => o.name)).toEqual(["small", "medium", "large"]);
    const own = connectProxmox({ ...config, offers: [{ name: "tiny", vcpus: 1, memoryMib: 512, diskGib: 4 }] }, ctxFor());
    expect(await own.offers()).toEqual([{ name: "tiny", vcpus: 1, memoryMib: 512, diskGib: 4 }]);
  });
});

describe("proxmox-ve emulator", () => {
  it("answers nextid as a string, UPIDs with nine fields, and errors in the reason phrase", async () => {
    const next = await raw("GET", "/cluster/nextid");
    expect(typeof next.body.data).toBe("string");
    const taken = await raw("GET", "/cluster/nextid?vmid=9000");
    expect(taken.status).toBe(400);
    expect(taken.body.errors?.vmid).toMatch(/already exists/);
    const clone = await raw("POST", "/nodes/pve/qemu/9000/clone", { newid: "9001", name: "x" });
    expect(clone.status).toBe(500);
    expect(clone.reason).toBe("unable to create VM 9001: config file already exists");
    const start = await raw("POST", "/nodes/pve/qemu/9000/status/start");
    expect(start.reason).toMatch(/template/);
    const unknown = await raw("GET", "/nodes/pve/lxc");
    expect(unknown.status).toBe(501);
    const noAuth = await fetch(`${config.endpoint}/cluster/nextid`);
    expect([noAuth.status, noAuth.statusText]).toEqual([401, "No ticket"]);
    const id = await emu.plant("inst_upid", "someone");
    const destroy = await raw("POST", `/nodes/pve/qemu/${id}/status/stop`);
    expect(String(destroy.body.data).split(":")).toHaveLength(9);
    expect(String(destroy.body.data)).toMatch(/^UPID:pve:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:qmstop:\d+:root@pam!bc:$/);
  });
});

describe("proxmox-ve status", () => {
  it("maps PVE's state, locks and our own tasks to machine states", () => {
    expect(statusOf({ status: "stopped", lock: "clone" })).toBe("creating");
    expect(statusOf({ status: "stopped", lock: "destroyed" })).toBe("deleting");
    expect(statusOf({ status: "stopped" }, "qmstart")).toBe("starting");
    expect(statusOf({ status: "running" }, "qmshutdown")).toBe("stopping");
    expect(statusOf({ status: "running", qmpstatus: "paused" })).toBe("unknown");
    expect(statusOf({ status: "running", lock: "backup" })).toBe("running");
    expect(statusOf({ status: "stopped", lock: "migrate" })).toBe("unknown");
    expect(statusOf({ status: "stopped" })).toBe("stopped");
  });
});

describe("proxmox-ve session", () => {
  it("creates a running VM labelled with the instance, with an address", async () => {
    const r = request();
    const made = await session.create(r);
    expect(made.instanceId).toBe(r.instanceId);
    expect(["starting", "running"]).toContain(made.status);
    await untilStatus(made.externalId, "running");
    const m = await session.get(made.externalId);
    expect(m?.addresses[0]).toMatch(/^10\./);
    expect(emu.machines().find((x) => x.externalId === made.externalId)).toMatchObject({ name: r.name, instanceId: r.instanceId, managedBy });
    const cfg = (await raw("GET", `/nodes/pve/qemu/${made.externalId}/config`)).body.data as Record<string, unknown>;
    expect(cfg).toMatchObject({ cores: 1, memory: "1024", ciuser: "root", ipconfig0: "ip=dhcp", agent: "1" });
    expect(cfg.scsi0).toMatch(/size=10G/);
    expect(String(cfg.tags).split(";")).toContain("bc-managed");
  });

  it("creates a VM powered off when asked", async () => {
    const made = await session.create(request({ start: false }));
    expect(made.status).toBe("stopped");
  });

  it("makes one VM per instance, however often create is called", async () => {
    const r = request();
    const a = await session.create(r);
    const b = await session.create(r);
    expect(b.externalId).toBe(a.externalId);
    expect(emu.createdPerInstance().get(r.instanceId)).toBe(1);

    const twin = request();
    const [c, d] = await Promise.all([session.create(twin), connect().create(twin)]);
    expect(d.externalId).toBe(c.externalId);
    await until("the twin's extra VM to go", () => emu.machines().filter((m) => m.instanceId === twin.instanceId).length === 1);
  });

  it("lets two instances race for nextid: both get a VM, with distinct VMIDs, and nothing extra", async () => {
    const before = emu.machines().length;
    const [r1, r2] = [request(), request()];
    const [a, b] = await Promise.all([session.create(r1), connect().create(r2)]);
    expect(a.externalId).not.toBe(b.externalId);
    expect(emu.machines().length).toBe(before + 2);
    for (const r of [r1, r2]) expect(emu.createdPerInstance().get(r.instanceId)).toBe(1);
    await untilStatus(a.externalId, "running");
    await untilStatus(b.externalId, "running");
  });

  it("takes another VMID when the one nextid gave is taken before the clone", async () => {
    let planted = "";
    const racing: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      if (!planted && String(input).endsWith("/cluster/nextid")) planted = await emu.plant("inst_racer", "someone-else");
      return res;
    };
    const made = await connect({ fetch: racing }).create(request());
    expect(planted).not.toBe("");
    expect(made.externalId).not.toBe(planted);
  });

  it("finishes a create that failed half-way, on the VM it already cloned", async () => {
    const r = request();
    let broke = false;
    const flaky: typeof fetch = async (input, init) => {
      if (!broke && init?.method === "PUT" && String(input).endsWith("/config")) {
        broke = true;
        throw new TypeError("fetch failed");
      }
      return fetch(input, init);
    };
    const e = await failure(connect({ fetch: flaky }).create(r));
    expect(e.kind).toBe("transient");
    const made = await connect().create(r);
    expect(emu.createdPerInstance().get(r.instanceId)).toBe(1);
    await untilStatus(made.externalId, "running");
  });

  it("refuses a name taken by a VM that is not the instance's", async () => {
    const foreign = await emu.plant("inst_foreign", managedBy);
    const e = await failure(session.create(request({ name: `planted-${foreign}` })));
    expect(e.kind).toBe("invalid");
  });

  it("finds by instance and lists only this deployment's VMs", async () => {
    const r = request();
    const made = await session.create(r);
    expect((await session.find(r.instanceId))?.externalId).toBe(made.externalId);
    expect(await session.find("inst_nobody")).toBeNull();
    const orphan = await emu.plant("inst_orphan", managedBy);
    const others = await emu.plant("inst_others", "someone-else");
    const listed = (await session.list()).map((m) => m.externalId);
    expect(listed).toEqual(expect.arrayContaining([made.externalId, orphan]));
    expect(listed).not.toContain(others);
    expect(listed).not.toContain("9000");
  });

  it("stops and starts, and repeating either does nothing", async () => {
    const made = await session.create(request());
    await untilStatus(made.externalId, "running");
    await session.start(made.externalId);
    await session.stop(made.externalId);
    expect(["stopping", "stopped"]).toContain(await machineStatus(session, made.externalId));
    await untilStatus(made.externalId, "stopped");
    const before = emu.requests();
    await session.stop(made.externalId);
    expect(emu.requests() - before).toBe(1); // the look, no stop
    await session.start(made.externalId);
    await untilStatus(made.externalId, "running");
  });

  it("deletes twice, after which get says null", async () => {
    const made = await session.create(request());
    await untilStatus(made.externalId, "running");
    await session.delete(made.externalId);
    await session.delete(made.externalId);
    await until("the VM to go", async () => (await session.get(made.externalId)) === null);
    expect(emu.machines().some((m) => m.externalId === made.externalId)).toBe(false);
    await session.delete(made.externalId);
    expect(await session.get("123456789")).toBeNull();
  });

  it("classifies each kind of failure of each operation", async () => {
    const running = await session.create(request());
    const idle = await session.create(request({ start: false }));
    await untilStatus(running.externalId, "running");
    const calls = {
      create: () => session.create(request()),
      get: () => session.get(running.externalId),
      list: () => session.list(),
      stop: () => session.stop(running.externalId),
      delete: () => session.delete(idle.externalId),
    };
    for (const kind of ["capacity", "quota", "auth", "invalid", "transient"] as const) {
      for (const [op, call] of Object.entries(calls)) {
        emu.failNext(op as keyof typeof calls, kind);
        const e = await failure(call());
        expect([op, e.kind]).toEqual([op, kind]);
      }
    }
    emu.failNext("start", "capacity");
    expect((await failure(session.start(idle.externalId))).kind).toBe("capacity");
    expect(await machineStatus(session, running.externalId)).toBe("running");
  });

  it("holds back after a 429 until Retry-After has passed, sending nothing meanwhile", async () => {
    const made = await session.create(request());
    const limited = connect();
    emu.rateLimit(1, 10_000);
    try {
      const e = await failure(limited.get(made.externalId));
      expect(e.kind).toBe("transient");
      expect(e.retryAfterMs).toBeGreaterThan(1000);
      expect(limited.pace()).toBeGreaterThan(1000);
      const before = emu.requests();
      const again = await failure(limited.list());
      expect([again.kind, emu.requests()]).toEqual(["transient", before]);
      expect(again.retryAfterMs).toBeGreaterThan(0);
    } finally {
      emu.rateLimit(1_000_000, 1000);
    }
    expect(emu.rateLimited()).toBeGreaterThan(0);
  });

  it("classifies what a proxy or the network answers: 502 pages, 429 without JSON, timeouts, refused connections", async () => {
    const answering =
      (res: () => Response): typeof fetch =>
      async () =>
        res();
    const gateway = connect({ fetch: answering(() => new Response("<html>bad gateway</html>", { status: 502, statusText: "Bad Gateway" })) });
    expect((await failure(gateway.list())).kind).toBe("transient");
    const limited = connect({ fetch: answering(() => new Response("slow down", { status: 429, headers: { "Retry-After": "2" } })) });
    const e = await failure(limited.list());
    expect([e.kind, e.retryAfterMs]).toEqual(["transient", 2000]);
    const hanging: typeof fetch = (_input, init) =>
      new Promise((_resolve, reject) => init?.signal?.addEventListener("abort", () => reject(init.signal?.reason)));
    const slow = connectProxmox(config, ctxFor({ fetch: hanging }), { requestTimeoutMs: 50 });
    expect((await failure(slow.list())).message).toMatch(/no answer within 50 ms/);
    const closed = connectProxmox({ ...config, endpoint: "http://127.0.0.1:1/api2/json" }, ctxFor());
    expect((await failure(closed.list())).kind).toBe("transient");
  });

  it("says auth for a wrong secret, and no error carries a secret", async () => {
    const wrong = connect({ credential: async () => "not-the-secret-0000" });
    const e = await failure(wrong.list());
    expect(e.kind).toBe("auth");
    const unreadable = connect({ credential: async () => "bad\nsecret" });
    expect((await failure(unreadable.list())).kind).toBe("auth");
    const secret = emu.credentials.tokenSecret as string;
    expect(thrown.length).toBeGreaterThan(20);
    for (const err of thrown) {
      const text = `${String(err)} ${JSON.stringify(err)} ${(err as Error).stack ?? ""}`;
      expect(text.includes(secret) || text.includes("not-the-secret-0000") || text.includes("bad\nsecret")).toBe(false);
    }
  });

  it("passes ssh keys with spaces, + and = through intact", async () => {
    const keys = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI+abc/def= alice@laptop with spaces", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB+/== bob+ops=1@host"];
    const made = await session.create(request({ sshKeys: keys }));
    const cfg = (await raw("GET", `/nodes/pve/qemu/${made.externalId}/config`)).body.data as { sshkeys: string };
    expect(decodeURIComponent(cfg.sshkeys).split("\n")).toEqual(keys);
  });
});
