import { existsSync, readdirSync, readFileSync, realpathSync, statSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { clearFailures, crashDomain, createFakeRuntime, injectFailure, setDomainAddresses } from "../../agent/runtimes/fake/index.ts";
import { RuntimeError } from "../../agent/runtimes/runtime.ts";
import { type InstanceSpec, instanceSpec } from "../../contracts/host.ts";
import { until } from "../support/fixtures.ts";
import { processesIn } from "../support/pidns.ts";

const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB1Xq0mWdJ9e3S0k alice@laptop";
const userData = "#!/bin/sh\necho hello from user data > /tmp/hello\n";
const sha = "ab".repeat(32);

function spec(id: string, over: Partial<InstanceSpec> = {}): InstanceSpec {
  return instanceSpec.parse({
    id,
    power: "running",
    vcpus: 2,
    memoryMib: 2048,
    diskGib: 20,
    gpus: [],
    image: { url: "https://images.example/debian-12.qcow2", sha256: sha, format: "qcow2" },
    sshKeys: [key],
    userData,
    hostname: "web-1",
    nic: { bridge: "br-bc", mac: "52:54:00:12:34:56", address: "10.20.0.5", prefix: 24, gateway: "10.20.0.1" },
    env: {},
    network: { egress: "all", allow: [] },
    fromSnapshot: null,
    ...over,
  });
}

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "bc-fake-runtime-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const stateOf = async (rt: ReturnType<typeof createFakeRuntime>, id: string) => (await rt.list()).find((d) => d.id === id)?.state;
const rejection = (p: Promise<unknown>) =>
  p.then(
    () => {
      throw new Error("expected a rejection");
    },
    (err: unknown) => err,
  );

describe("fake runtime", () => {
  it("creates a stopped domain with overlay, seed and a shared base image", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    expect(await rt.list()).toEqual([{ id: "inst_a", state: "stopped", shape: { vcpus: 2, memoryMib: 2048, diskGib: 20 }, addresses: [] }]);

    const domain = JSON.parse(readFileSync(join(dir, "domains", "inst_a.json"), "utf8"));
    expect(domain).toMatchObject({
      id: "inst_a",
      state: "stopped",
      mac: "52:54:00:12:34:56",
      image: { url: "https://images.example/debian-12.qcow2", sha256: sha },
    });
    expect(typeof domain.createdAt).toBe("string");

    const overlay = JSON.parse(readFileSync(join(dir, "overlays", "inst_a.qcow2"), "utf8"));
    expect(overlay).toMatchObject({ backingSha256: sha, virtualSizeGib: 20 });

    const seed = readFileSync(join(dir, "seeds", "inst_a.iso"), "utf8");
    expect(seed).toContain("alice@laptop");
    const files = JSON.parse(seed).files;
    expect(files["meta-data"]).toBe("instance-id: inst_a\nlocal-hostname: web-1\n");
    expect(files["user-data"]).toContain("#cloud-config\nssh_authorized_keys:\n");
    expect(files["user-data"]).toContain(key);
    expect(files["user-data"]).toContain(userData);
    // Nothing from the spec beyond keys, user data, id, hostname and the NIC's own address reaches the seed.
    for (const leak of ["br-bc", "images.example"]) expect(seed).not.toContain(leak);
    expect(files["network-config"]).toContain('macaddress: "52:54:00:12:34:56"');
    expect(files["network-config"]).toContain('addresses: ["10.20.0.5/24"]');
    expect(files["user-data"]).not.toContain("10.20.0.5");

    const base = join(dir, "images", sha);
    const inode = statSync(base).ino;
    await rt.create(spec("inst_b", { userData: null }));
    expect(readdirSync(join(dir, "images"))).toEqual([sha]);
    expect(statSync(base).ino).toBe(inode); // reused, not fetched again
    const seedB = JSON.parse(readFileSync(join(dir, "seeds", "inst_b.iso"), "utf8")).files;
    expect(seedB["user-data"]).toBe(`#cloud-config\nssh_authorized_keys:\n  - ${JSON.stringify(key)}\n`);
    expect((await rt.list()).map((d) => d.id)).toEqual(["inst_a", "inst_b"]);
  });

  it("refuses an image whose digest is not a sha256, for good", async () => {
    const rt = createFakeRuntime({ dir });
    const err = await rejection(rt.create(spec("inst_a", { image: { url: "https://x/y", sha256: "../../etc", format: "raw" } })));
    expect(err).toBeInstanceOf(RuntimeError);
    expect((err as RuntimeError).retryable).toBe(false);
    expect(await rt.list()).toEqual([]);
  });

  it("refuses invalid transitions and missing domains, not retryable", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    for (const call of [() => rt.pause("inst_a"), () => rt.resume("inst_a")]) {
      const err = await rejection(call());
      expect(err).toBeInstanceOf(RuntimeError);
      expect((err as RuntimeError).retryable).toBe(false);
    }
    await rt.start("inst_a");
    await rt.pause("inst_a");
    expect(await rejection(rt.start("inst_a"))).toBeInstanceOf(RuntimeError); // libvirt: already active
    expect(await stateOf(rt, "inst_a")).toBe("paused");

    const shape = { vcpus: 1, memoryMib: 512, diskGib: 10 };
    for (const call of [
      () => rt.start("inst_nope"),
      () => rt.stop("inst_nope"),
      () => rt.pause("inst_nope"),
      () => rt.resume("inst_nope"),
      () => rt.resize("inst_nope", shape),
    ]) {
      const err = await rejection(call());
      expect(err).toBeInstanceOf(RuntimeError);
      expect((err as RuntimeError).retryable).toBe(false);
      expect((err as Error).message).toContain("inst_nope");
    }
    expect(await rejection(rt.start("../escape"))).toBeInstanceOf(RuntimeError);
  });

  it("resizes only a stopped domain, and the disk only grows", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    await rt.start("inst_a");
    const running = await rejection(rt.resize("inst_a", { vcpus: 4, memoryMib: 4096, diskGib: 40 }));
    expect(running).toBeInstanceOf(RuntimeError);
    expect((running as RuntimeError).retryable).toBe(false);
    await rt.stop("inst_a");

    const shrink = await rejection(rt.resize("inst_a", { vcpus: 4, memoryMib: 4096, diskGib: 10 }));
    expect(shrink).toBeInstanceOf(RuntimeError);
    expect((shrink as RuntimeError).retryable).toBe(false);
    expect((await rt.list())[0]?.shape).toEqual({ vcpus: 2, memoryMib: 2048, diskGib: 20 });

    await rt.resize("inst_a", { vcpus: 1, memoryMib: 1024, diskGib: 20 }); // cpu and memory may go down
    await rt.resize("inst_a", { vcpus: 4, memoryMib: 4096, diskGib: 40 });
    expect((await rt.list())[0]).toMatchObject({ state: "stopped", shape: { vcpus: 4, memoryMib: 4096, diskGib: 40 } });
    expect(JSON.parse(readFileSync(join(dir, "overlays", "inst_a.qcow2"), "utf8")).virtualSizeGib).toBe(40);
  });

  it("removes domain, overlay and seed, idempotently", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    await rt.create(spec("inst_b"));
    await rt.start("inst_a");
    await rt.remove("inst_a");
    await rt.remove("inst_a");
    await rt.remove("inst_never");
    for (const p of ["domains/inst_a.json", "overlays/inst_a.qcow2", "seeds/inst_a.iso"]) expect(existsSync(join(dir, p))).toBe(false);
    expect((await rt.list()).map((d) => d.id)).toEqual(["inst_b"]);
    expect(existsSync(join(dir, "images", sha))).toBe(true); // the base stays for the next instance
  });

  it("a second runtime on the same directory sees the same domains", async () => {
    const first = createFakeRuntime({ dir });
    await first.create(spec("inst_a"));
    await first.create(spec("inst_b"));
    await first.start("inst_a");
    await first.close();

    const second = createFakeRuntime({ dir });
    expect(await second.list()).toMatchObject([
      { id: "inst_a", state: "running" },
      { id: "inst_b", state: "stopped" },
    ]);
    await second.pause("inst_a");
    expect(await stateOf(second, "inst_a")).toBe("paused");
    await second.close();
  });

  it("injected failures: once, then forever, then cleared", async () => {
    const rt = createFakeRuntime({ dir });
    injectFailure(dir, "create", { error: "no space left on host", retryable: true, times: 1 });
    const once = await rejection(rt.create(spec("inst_a")));
    expect(once).toBeInstanceOf(RuntimeError);
    expect(once).toMatchObject({ message: "no space left on host", retryable: true });
    expect(await rt.list()).toEqual([]);
    expect(existsSync(join(dir, "inject.json"))).toBe(false); // the last use removed the entry
    await rt.create(spec("inst_a"));
    expect(await stateOf(rt, "inst_a")).toBe("stopped");

    injectFailure(dir, "start", { error: "image digest mismatch", retryable: false });
    for (let i = 0; i < 3; i++) expect(await rejection(rt.start("inst_a"))).toMatchObject({ message: "image digest mismatch", retryable: false });
    expect(JSON.parse(readFileSync(join(dir, "inject.json"), "utf8"))).toEqual({ start: { error: "image digest mismatch", retryable: false } });
    clearFailures(dir);
    await rt.start("inst_a");
    expect(await stateOf(rt, "inst_a")).toBe("running");
  });

  it("an injected count is spent exactly, even by concurrent calls", async () => {
    const rt = createFakeRuntime({ dir });
    injectFailure(dir, "create", { error: "busy", retryable: true, times: 2 });
    const results = await Promise.allSettled(["inst_a", "inst_b", "inst_c"].map((id) => rt.create(spec(id))));
    expect(results.filter((r) => r.status === "rejected")).toHaveLength(2);
    expect(await rt.list()).toHaveLength(1);
  });

  it("an operation takes effect after its delay", async () => {
    const rt = createFakeRuntime({ dir, delays: { start: 50 } });
    await rt.create(spec("inst_a"));
    const started = rt.start("inst_a");
    expect(await stateOf(rt, "inst_a")).toBe("stopped");
    await started;
    expect(await stateOf(rt, "inst_a")).toBe("running");
  });

  it("operations on one domain do not interleave", async () => {
    const rt = createFakeRuntime({ dir, delays: { start: 50 } });
    await rt.create(spec("inst_a"));
    await rt.create(spec("inst_b"));
    const order: string[] = [];
    const start = rt.start("inst_a").then(() => order.push("start"));
    // No delay on stop: unserialised, it would find the domain stopped, do nothing, and finish first.
    const stop = rt.stop("inst_a").then(() => order.push("stop"));
    // Another domain is not held up by inst_a's queue.
    await rt.stop("inst_b").then(() => order.push("other"));
    await Promise.all([start, stop]);
    expect(order).toEqual(["other", "start", "stop"]);
    expect(await stateOf(rt, "inst_a")).toBe("stopped");
  });

  it("reports its capacity", async () => {
    expect(await createFakeRuntime({ dir }).capacity()).toEqual({ vcpus: 16, memoryMib: 65536, diskGib: 1000, gpus: [] });
    const capacity = { vcpus: 4, memoryMib: 8192, diskGib: 100, gpus: [{ model: "L4", pciAddress: "0000:01:00.0" }] };
    const rt = createFakeRuntime({ dir: join(dir, "other"), capacity });
    expect(await rt.capacity()).toEqual(capacity);
    expect(rt.id).toBe("fake");
  });
});

describe("fake runtime: what happens to a guest by itself", () => {
  it("a crashed guest stays crashed until it is stopped or started, and cannot be paused or saved", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_c"));
    await rt.start("inst_c");
    crashDomain(dir, "inst_c");
    expect(await stateOf(rt, "inst_c")).toBe("crashed");
    expect(await rejection(rt.pause("inst_c"))).toBeInstanceOf(RuntimeError);
    expect(await rejection(rt.snapshot("inst_c", "snap_a"))).toBeInstanceOf(RuntimeError);
    await rt.stop("inst_c");
    expect(await stateOf(rt, "inst_c")).toBe("stopped");
    crashDomain(dir, "inst_c");
    await rt.start("inst_c");
    expect(await stateOf(rt, "inst_c")).toBe("running");
  });

  it("lists the addresses its guest is seen to use", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_d"));
    setDomainAddresses(dir, "inst_d", ["fd00::d", "10.20.0.5"]);
    expect((await rt.list()).find((d) => d.id === "inst_d")?.addresses).toEqual(["fd00::d", "10.20.0.5"]);
  });

  it("stands in for libvirt-kvm hosts unless told which runtimes it serves", () => {
    expect(createFakeRuntime({ dir }).serves).toEqual(["fake", "libvirt-kvm"]);
    expect(createFakeRuntime({ dir, serves: ["fake"] }).serves).toEqual(["fake"]);
  });
});

describe("fake runtime snapshots", () => {
  const snapDir = (id: string, snap: string) => join(dir, "snapshots", id, snap);
  const overlayOf = (id: string) => JSON.parse(readFileSync(join(dir, "overlays", `${id}.qcow2`), "utf8"));
  const bytesIn = (d: string) => readdirSync(d).reduce((n, f) => n + statSync(join(d, f)).size, 0);

  it("keeps memory and disk with the domain, which ends in the power state it had", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    await rt.start("inst_a");
    const { sizeBytes } = await rt.snapshot("inst_a", "snap_run");
    expect(await stateOf(rt, "inst_a")).toBe("running");
    expect(readdirSync(snapDir("inst_a", "snap_run")).sort()).toEqual(["domain.json", "overlay.qcow2"]);
    expect(sizeBytes).toBe(bytesIn(snapDir("inst_a", "snap_run")));
    expect(readdirSync(join(dir, "snapshots", "inst_a"))).toEqual(["snap_run"]); // nothing partial left behind

    await rt.pause("inst_a");
    await rt.snapshot("inst_a", "snap_paused");
    expect(await stateOf(rt, "inst_a")).toBe("paused");
  });

  it("takes a snapshot once per id: a second call returns its size and rewrites nothing", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    await rt.start("inst_a");
    const first = await rt.snapshot("inst_a", "snap_1");
    const inode = statSync(join(snapDir("inst_a", "snap_1"), "overlay.qcow2")).ino;
    await rt.stop("inst_a"); // even stopped now: the snapshot exists, nothing needs the domain's memory
    expect(await rt.snapshot("inst_a", "snap_1")).toEqual(first);
    expect(statSync(join(snapDir("inst_a", "snap_1"), "overlay.qcow2")).ino).toBe(inode);
  });

  it("refuses a stopped domain, a missing domain and a bad snapshot name, not retryable", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    for (const call of [() => rt.snapshot("inst_a", "snap_1"), () => rt.snapshot("inst_nope", "snap_1"), () => rt.snapshot("inst_a", "../x")]) {
      const err = await rejection(call());
      expect(err).toBeInstanceOf(RuntimeError);
      expect((err as RuntimeError).retryable).toBe(false);
    }
    expect(existsSync(join(dir, "snapshots", "inst_a", "snap_1"))).toBe(false);
  });

  it("restores disk and power as saved, from any power state, as often as asked", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    await rt.start("inst_a");
    await rt.snapshot("inst_a", "snap_1");
    await rt.stop("inst_a");
    await rt.resize("inst_a", { vcpus: 4, memoryMib: 4096, diskGib: 40 });
    expect(overlayOf("inst_a").virtualSizeGib).toBe(40);

    await rt.restore("inst_a", "snap_1"); // from stopped
    expect((await rt.list())[0]).toMatchObject({ state: "running", shape: { vcpus: 2, memoryMib: 2048, diskGib: 20 } });
    expect(overlayOf("inst_a").virtualSizeGib).toBe(20);
    await rt.pause("inst_a");
    await rt.restore("inst_a", "snap_1"); // from paused
    expect(await stateOf(rt, "inst_a")).toBe("running");
    await rt.restore("inst_a", "snap_1"); // from running
    expect(await stateOf(rt, "inst_a")).toBe("running");

    await rt.pause("inst_a");
    await rt.snapshot("inst_a", "snap_paused");
    await rt.resume("inst_a");
    await rt.restore("inst_a", "snap_paused");
    expect(await stateOf(rt, "inst_a")).toBe("paused");
  });

  it("refuses an unknown snapshot, not retryable, and leaves the domain as it was", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    await rt.start("inst_a");
    const err = await rejection(rt.restore("inst_a", "snap_never"));
    expect(err).toBeInstanceOf(RuntimeError);
    expect(err).toMatchObject({ retryable: false, message: expect.stringContaining("snap_never") });
    expect(await stateOf(rt, "inst_a")).toBe("running");
  });

  it("shows the domain stopped while it is saved, as a hypervisor would", async () => {
    const rt = createFakeRuntime({ dir, delays: { snapshot: 300 } });
    await rt.create(spec("inst_a"));
    await rt.start("inst_a");
    const taking = rt.snapshot("inst_a", "snap_1");
    await until("the save to stop the domain", async () => (await stateOf(rt, "inst_a")) === "stopped", 5000, 5);
    await taking;
    expect(await stateOf(rt, "inst_a")).toBe("running");
  });

  it("finishes a snapshot the agent died in, and brings the domain back as it was", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    await rt.start("inst_a");
    await rt.pause("inst_a");
    // What a save leaves on disk when the process dies before the domain is back: off, and marked.
    const file = join(dir, "domains", "inst_a.json");
    const record = JSON.parse(readFileSync(file, "utf8"));
    writeFileSync(file, JSON.stringify({ ...record, state: "stopped", saving: { snapshotId: "snap_1", power: "paused" } }));

    const again = createFakeRuntime({ dir });
    expect(await stateOf(again, "inst_a")).toBe("stopped");
    const { sizeBytes } = await again.snapshot("inst_a", "snap_1");
    expect(sizeBytes).toBe(bytesIn(snapDir("inst_a", "snap_1")));
    expect(await stateOf(again, "inst_a")).toBe("paused");
    expect(JSON.parse(readFileSync(join(snapDir("inst_a", "snap_1"), "domain.json"), "utf8"))).toMatchObject({ state: "paused" });
    expect(JSON.parse(readFileSync(file, "utf8")).saving).toBeUndefined();

    // Started instead (the converger got there first): the same, the domain comes back as it was saved.
    writeFileSync(file, JSON.stringify({ ...record, state: "stopped", saving: { snapshotId: "snap_2", power: "paused" } }));
    await again.start("inst_a");
    expect(await stateOf(again, "inst_a")).toBe("paused");
    expect(existsSync(snapDir("inst_a", "snap_2"))).toBe(true);
  });

  it("injected failures on snapshot and restore change nothing", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    await rt.start("inst_a");
    injectFailure(dir, "snapshot", { error: "no space for the memory image", retryable: true, times: 1 });
    expect(await rejection(rt.snapshot("inst_a", "snap_1"))).toMatchObject({ message: "no space for the memory image", retryable: true });
    expect(existsSync(snapDir("inst_a", "snap_1"))).toBe(false);
    expect(await stateOf(rt, "inst_a")).toBe("running");
    await rt.snapshot("inst_a", "snap_1");

    await rt.pause("inst_a");
    injectFailure(dir, "restore", { error: "libvirt: restore failed", retryable: true, times: 1 });
    expect(await rejection(rt.restore("inst_a", "snap_1"))).toMatchObject({ message: "libvirt: restore failed" });
    expect(await stateOf(rt, "inst_a")).toBe("paused");
    await rt.restore("inst_a", "snap_1");
    expect(await stateOf(rt, "inst_a")).toBe("running");
  });

  it("remove takes the domain's snapshots with it", async () => {
    const rt = createFakeRuntime({ dir });
    await rt.create(spec("inst_a"));
    await rt.start("inst_a");
    await rt.snapshot("inst_a", "snap_1");
    await rt.remove("inst_a");
    expect(existsSync(join(dir, "snapshots", "inst_a"))).toBe(false);
  });
});

describe("fake runtime exec", () => {
  const running: { close(): Promise<void> }[] = [];
  afterEach(async () => {
    // Before the directory goes: the runtime kills what its guests still run.
    for (const rt of running.splice(0)) await rt.close();
  });
  async function guest(over: Partial<InstanceSpec> = {}) {
    const rt = createFakeRuntime({ dir });
    running.push(rt);
    await rt.create(spec("inst_a", over));
    await rt.start("inst_a");
    return rt;
  }
  type Req = Parameters<ReturnType<typeof createFakeRuntime>["exec"]>[1];
  const req = (command: string[], over: Partial<Req> = {}): Req => ({ command, env: {}, stdin: null, timeoutMs: 10_000, ...over });
  /** Runs the command, collecting what each stream said and how often output came. */
  async function run(rt: ReturnType<typeof createFakeRuntime>, r: Req, id = "inst_a") {
    const out = { stdout: "", stderr: "", pieces: 0 };
    const result = await rt.exec(id, r, (stream, data) => {
      out[stream] += data;
      out.pieces++;
    });
    return { result, ...out };
  }

  it("runs the command with only PATH and the spec's and the request's env, in the domain's scratch dir", async () => {
    const rt = await guest({ env: { GREETING: "from the template", SHARED: "template" } });
    const { result, stdout } = await run(rt, req(["env"], { env: { SHARED: "request", EXTRA: "x=y" } }));
    expect(result).toEqual({ exitCode: 0, signal: null, timedOut: false });
    expect(stdout.trim().split("\n").sort()).toEqual(["EXTRA=x=y", "GREETING=from the template", expect.stringMatching(/^PATH=\/usr/), "SHARED=request"]);

    const pwd = await run(rt, req(["pwd"]));
    expect(pwd.stdout).toBe(`${realpathSync(join(dir, "scratch", "inst_a"))}\n`);
    // No shell unless asked for: the argument is not expanded.
    expect((await run(rt, req(["echo", "$HOME", "*"]))).stdout).toBe("$HOME *\n");
  });

  it("streams each stream in order, decodes UTF-8 across reads, and returns the exit code", async () => {
    const rt = await guest();
    const lines = await run(rt, req(["sh", "-c", 'for i in 1 2 3 4 5; do echo "out$i"; echo "err$i" >&2; done; exit 7']));
    expect(lines.result).toEqual({ exitCode: 7, signal: null, timedOut: false });
    expect(lines.stdout).toBe("out1\nout2\nout3\nout4\nout5\n");
    expect(lines.stderr).toBe("err1\nerr2\nerr3\nerr4\nerr5\n");

    // 180 kB of multi-byte characters: many reads, boundaries inside characters, none mangled.
    const wide = await run(rt, req(["sh", "-c", "i=0; while [ $i -lt 20000 ]; do printf 'é€😀'; i=$((i+1)); done"]));
    expect(wide.stdout).toBe("é€😀".repeat(20_000));
    expect(wide.pieces).toBeGreaterThan(1);
  });

  it("feeds stdin when given, and closed input otherwise", async () => {
    const rt = await guest();
    expect((await run(rt, req(["cat"], { stdin: "hello\nwörld" }))).stdout).toBe("hello\nwörld");
    // No input: cat sees end of file at once instead of waiting for the timeout.
    expect(await run(rt, req(["cat"], { timeoutMs: 5000 }))).toMatchObject({ result: { exitCode: 0, timedOut: false }, stdout: "" });
    // Input the command never reads is no error.
    expect((await run(rt, req(["true"], { stdin: "x".repeat(1_000_000) }))).result.exitCode).toBe(0);
  });

  it("answers a missing program as a shell would: exit 127 and a line on stderr", async () => {
    const rt = await guest();
    expect(await run(rt, req(["no-such-program-here", "arg"]))).toMatchObject({
      result: { exitCode: 127, signal: null, timedOut: false },
      stderr: "no-such-program-here: command not found\n",
    });
  });

  it("kills the command's whole process group at its timeout", async () => {
    const rt = await guest();
    const started = Date.now();
    // Its pids are its pid namespace's, not the host's: the namespace names the background child from outside.
    const out = await run(rt, req(["sh", "-c", "sleep 30 & readlink /proc/$!/ns/pid > child.ns; echo started; wait"], { timeoutMs: 300 }));
    expect(out.result).toEqual({ exitCode: null, signal: "SIGKILL", timedOut: true });
    expect(out.stdout).toBe("started\n");
    expect(Date.now() - started).toBeLessThan(10_000);
    const ns = readFileSync(join(dir, "scratch", "inst_a", "child.ns"), "utf8").trim();
    await until("the background child to be gone too", () => processesIn(ns).length === 0, 5000, 10);
  });

  it("refuses a domain that is not running, or not there, not retryable", async () => {
    const rt = createFakeRuntime({ dir });
    running.push(rt);
    await rt.create(spec("inst_a"));
    const stopped = await rejection(rt.exec("inst_a", req(["true"]), () => {}));
    expect(stopped).toBeInstanceOf(RuntimeError);
    expect(stopped).toMatchObject({ retryable: false, message: expect.stringContaining("is stopped, exec needs it running") });
    await rt.start("inst_a");
    await rt.pause("inst_a");
    expect(await rejection(rt.exec("inst_a", req(["true"]), () => {}))).toMatchObject({ retryable: false, message: expect.stringContaining("paused") });
    expect(await rejection(rt.exec("inst_nope", req(["true"]), () => {}))).toMatchObject({ retryable: false, message: expect.stringContaining("inst_nope") });
    expect(existsSync(join(dir, "scratch", "inst_a"))).toBe(false); // nothing ran
  });

  it("runs several execs of one domain side by side, and a stop ends those still running", async () => {
    const rt = await guest();
    // The first waits for what the second does: run one after the other, the first would time out.
    const waiting = run(rt, req(["sh", "-c", "while [ ! -f go ]; do sleep 0.01; done; echo went"], { timeoutMs: 5000 }));
    await run(rt, req(["touch", "go"]));
    expect(await waiting).toMatchObject({ result: { exitCode: 0, timedOut: false }, stdout: "went\n" });

    let up = false;
    const sleeping = rt.exec("inst_a", req(["sh", "-c", "echo up; exec sleep 30"], { timeoutMs: 60_000 }), () => (up = true));
    await until("the command to run", () => up, 5000, 5);
    await rt.stop("inst_a");
    expect(await sleeping).toEqual({ exitCode: null, signal: "SIGKILL", timedOut: false });
  });

  it("keeps the spec's env and network policy in the domain's record", async () => {
    const network = { egress: "allowlist" as const, allow: [{ cidr: "10.0.0.0/8", port: 443, proto: "tcp" as const }] };
    await guest({ env: { A: "1" }, network });
    expect(JSON.parse(readFileSync(join(dir, "domains", "inst_a.json"), "utf8"))).toMatchObject({ env: { A: "1" }, network });
  });
});

describe("fake runtime: a domain made from another's snapshot", () => {
  const running: { close(): Promise<void> }[] = [];
  afterEach(async () => {
    for (const rt of running.splice(0)) await rt.close();
  });
  const record = (id: string) => JSON.parse(readFileSync(join(dir, "domains", `${id}.json`), "utf8"));
  const req = (command: string[]) => ({ command, env: {}, stdin: null, timeoutMs: 10_000 });
  const fork = (over: Partial<InstanceSpec> = {}) =>
    spec("inst_b", {
      fromSnapshot: { instanceId: "inst_a", snapshotId: "snap_1" },
      nic: { bridge: "br-bc", mac: "52:54:00:00:00:bb", address: null, prefix: null, gateway: null },
      hostname: "fork",
      env: { WHO: "fork" },
      ...over,
    });

  it("starts paused with the source's disk, memory and files, under its own identity; resuming runs it on", async () => {
    const rt = createFakeRuntime({ dir });
    running.push(rt);
    await rt.create(spec("inst_a", { env: { WHO: "source" }, vcpus: 3 }));
    await rt.start("inst_a");
    await rt.exec("inst_a", req(["sh", "-c", "echo saved > note"]), () => {});
    await rt.snapshot("inst_a", "snap_1");
    // What the source does after the snapshot is not the fork's.
    await rt.exec("inst_a", req(["sh", "-c", "echo later > note"]), () => {});

    await rt.create(fork({ vcpus: 3 }));
    expect((await rt.list()).find((d) => d.id === "inst_b")).toEqual({
      id: "inst_b",
      state: "paused",
      shape: { vcpus: 3, memoryMib: 2048, diskGib: 20 },
      addresses: [],
    });
    expect(record("inst_b")).toMatchObject({
      mac: "52:54:00:00:00:bb",
      env: { WHO: "fork" },
      image: record("inst_a").image,
      fromSnapshot: { instanceId: "inst_a", snapshotId: "snap_1" },
    });
    expect(readFileSync(join(dir, "overlays", "inst_b.qcow2"), "utf8")).toBe(readFileSync(join(dir, "snapshots", "inst_a", "snap_1", "overlay.qcow2"), "utf8"));
    expect(JSON.parse(readFileSync(join(dir, "seeds", "inst_b.iso"), "utf8")).files["meta-data"]).toContain("local-hostname: fork");

    await rt.create(fork({ vcpus: 8 })); // idempotent: made once
    expect(record("inst_b")).toMatchObject({ state: "paused", shape: { vcpus: 3 } });
    await rt.resume("inst_b");
    expect(await stateOf(rt, "inst_b")).toBe("running");
    const seen: string[] = [];
    await rt.exec("inst_b", req(["sh", "-c", 'cat note; echo "$WHO"']), (_, d) => seen.push(d));
    expect(seen.join("")).toBe("saved\nfork\n");
    expect(await stateOf(rt, "inst_a")).toBe("running");
  });

  it("refuses an unknown snapshot or source domain, not retryable, and makes nothing", async () => {
    const rt = createFakeRuntime({ dir });
    running.push(rt);
    await rt.create(spec("inst_a"));
    await rt.start("inst_a");
    for (const [from, says] of [
      [{ instanceId: "inst_a", snapshotId: "snap_never" }, "no snapshot snap_never of domain 'inst_a'"],
      [{ instanceId: "inst_gone", snapshotId: "snap_1" }, "inst_gone"],
      [{ instanceId: "inst_b", snapshotId: "snap_1" }, "inst_b"],
    ] as const) {
      const err = await rejection(rt.create(fork({ fromSnapshot: from })));
      expect(err).toBeInstanceOf(RuntimeError);
      expect(err).toMatchObject({ retryable: false, message: expect.stringContaining(says) });
    }
    expect((await rt.list()).map((d) => d.id)).toEqual(["inst_a"]);
  });
});
