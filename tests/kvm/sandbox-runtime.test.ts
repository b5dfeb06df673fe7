import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLibvirtRuntime, type LibvirtRuntimeExtras } from "../../agent/runtimes/libvirt-kvm/index.ts";
import { type Runtime, RuntimeError } from "../../agent/runtimes/runtime.ts";
import { type ExecRequest, type InstanceSpec, tapFor } from "../../contracts/host.ts";
import { until } from "../support/fixtures.ts";
import { buildGuest, type Guest } from "./guest.ts";
import {
  type AgentGuest,
  buildAgentGuest,
  guestSaid,
  loopbackSources,
  makeBridge,
  openPath,
  requireHypervisor,
  serveFiles,
  sh,
  tinySpec,
  virsh,
} from "./support.ts";

/**
 * Sandboxes on this machine's libvirtd: exec through the QEMU guest agent of a real guest (qemu-ga from
 * Debian's package, ./support.ts), and new domains made from another one's snapshot.
 */

type Rt = Runtime & LibvirtRuntimeExtras;
let agentGuest: AgentGuest;
let plainGuest: Guest;
let rt: Rt;
let plain: Rt;
let server: Awaited<ReturnType<typeof serveFiles>>;
let bridge: Awaited<ReturnType<typeof makeBridge>>;
const root = mkdtempSync(join(tmpdir(), "bc-kvm-sbx-"));
const made: [Rt, string][] = [];
const timings: string[] = [];

beforeAll(async () => {
  await requireHypervisor();
  [agentGuest, plainGuest] = await Promise.all([buildAgentGuest(), buildGuest()]);
  server = await serveFiles({ "base.qcow2": agentGuest.base });
  bridge = await makeBridge(`bcsb${process.pid % 10000}`);
  await openPath(root);
  await openPath(agentGuest.kernel);
  await openPath(agentGuest.initrd);
  const boot = (g: Guest) => ({ kernel: g.kernel, initrd: g.initrd, cmdline: g.cmdline });
  rt = (await createLibvirtRuntime({ stateDir: join(root, "state"), boot: boot(agentGuest), shutdownTimeoutMs: 500, imageSources: loopbackSources })) as Rt;
  plain = (await createLibvirtRuntime({
    stateDir: join(root, "plain"),
    boot: boot(plainGuest),
    shutdownTimeoutMs: 500,
    imageSources: loopbackSources,
    agentWaitMs: 3000,
  })) as Rt;
}, 300_000);

afterAll(async () => {
  for (const [r, id] of made) await r.remove(id).catch(() => {});
  await rt?.close();
  await plain?.close();
  await bridge?.remove();
  await server?.close();
  rmSync(root, { recursive: true, force: true });
  if (timings.length) console.log(`sandbox timings:\n  ${timings.join("\n  ")}`);
});

let n = 0;
/** Ids of the contract's shape (52 base32 characters), distinct in the 12 that name the tap. */
function spec(r: Rt, over: Partial<InstanceSpec> = {}): InstanceSpec {
  n++;
  const id = `inst_sbx${"abcdefgh"[n % 8]}${process.pid.toString(32).replace(/[^a-z2-7]/g, "a")}`.padEnd(57, "q");
  made.push([r, id]);
  return {
    ...tinySpec(id, { url: server.url("base.qcow2"), sha256: agentGuest.sha256, bridge: bridge.name, mac: `52:54:00:5b:00:0${n}` }),
    ...over,
  };
}

const req = (command: string[], over: Partial<Omit<ExecRequest, "instanceId">> = {}) => ({ command, env: {}, stdin: null, timeoutMs: 30_000, ...over });

/** Runs a command; its output as the runtime streamed it, by stream, with the time each piece came. */
async function run(r: Rt, id: string, command: string[], over: Partial<Omit<ExecRequest, "instanceId">> = {}) {
  const pieces: { stream: "stdout" | "stderr"; data: string; at: number }[] = [];
  const result = await r.exec(id, req(command, over), (stream, data) => pieces.push({ stream, data, at: Date.now() }));
  const text = (s: "stdout" | "stderr") =>
    pieces
      .filter((p) => p.stream === s)
      .map((p) => p.data)
      .join("");
  return { ...result, stdout: text("stdout"), stderr: text("stderr"), pieces, done: Date.now() };
}

const stateOf = async (r: Rt, id: string) => (await r.list()).find((d) => d.id === id)?.state;
const counter = async (id: string) => Number((await run(rt, id, ["cat", "/tmp/bc-counter"])).stdout.trim());
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

/** A guest booted: its init has said ready (the seed is mounted by then), and its agent answers. */
async function booted(r: Rt, id: string): Promise<void> {
  await until("the guest to be ready", () => "ready" in guestSaid(r.consolePath(id)), 120_000, 100);
  await until("the guest's agent and counter", async () => (await run(r, id, ["cat", "/tmp/bc-counter"]).catch(() => null))?.exitCode === 0, 60_000, 100);
}

describe("sandboxes on this machine's libvirtd", () => {
  it("execs in the guest through its agent: its own output, env, stdin, exit codes, streaming, timeouts; paused and stopped refuse", async () => {
    const s = spec(rt, { env: { BC_FROM_SPEC: "spec value", SHARED: "from spec" } });
    await rt.create(s);
    await rt.start(s.id);
    await booted(rt, s.id);

    // The guest's kernel (Debian's cloud kernel), not this host's.
    const uname = await run(rt, s.id, ["uname", "-r"]);
    expect(uname).toMatchObject({ exitCode: 0, signal: null, timedOut: false });
    expect(uname.stdout.trim()).toMatch(/cloud-amd64$/);
    expect(uname.stdout.trim()).not.toBe((await sh("uname", ["-r"])).trim());
    const cpu = await run(rt, s.id, ["sh", "-c", "cat /proc/cpuinfo | head -n 8"]);
    expect(cpu.stdout).toMatch(/model name\s*:\s*QEMU/);

    // The spec's env under the request's; PATH and HOME are there though guest-exec replaces the environment.
    const env = await run(rt, s.id, ["sh", "-c", 'echo "$BC_FROM_SPEC|$SHARED|$BC_FROM_REQ|$HOME|$PATH"'], {
      env: { BC_FROM_REQ: "req's 'value'", SHARED: "from req" },
    });
    expect(env.stdout).toBe("spec value|from req|req's 'value'|/root|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
    // A login sees the spec's env too: the seed writes it to /etc/profile.d (cloud-init's write_files).
    const seed = await run(rt, s.id, ["cat", "/seed/user-data"]);
    expect(seed.stdout).toContain("path: /etc/profile.d/bc-env.sh");
    expect(seed.stdout).toContain("export BC_FROM_SPEC='spec value'");

    const stdin = "line one\nlïne twø\n".repeat(1000);
    expect(await run(rt, s.id, ["cat"], { stdin })).toMatchObject({ exitCode: 0, stdout: stdin, stderr: "" });
    expect(await run(rt, s.id, ["sh", "-c", "echo out; echo err >&2; exit 7"])).toMatchObject({ exitCode: 7, signal: null, stdout: "out\n", stderr: "err\n" });
    const missing = await run(rt, s.id, ["no-such-command"]);
    expect(missing.exitCode).toBe(127);
    expect(missing.stderr).toMatch(/no-such-command/);

    // Output streams while the command runs, and is not bound by libvirt's 4 MiB reply limit.
    const streamed = await run(rt, s.id, ["sh", "-c", "echo first; sleep 1.5; echo second"]);
    expect(streamed.stdout).toBe("first\nsecond\n");
    expect(streamed.pieces.length).toBe(2);
    expect(streamed.done - (streamed.pieces[0]?.at ?? 0)).toBeGreaterThan(700);
    const big = await run(rt, s.id, ["sh", "-c", "head -c 6000000 /dev/zero | tr '\\0' a"]);
    expect(big.exitCode).toBe(0);
    expect(big.stdout.length).toBe(6_000_000);
    expect(big.stdout.replaceAll("a", "")).toBe("");

    // Past its timeout the command is killed, with what it started.
    const started = Date.now();
    const slow = await run(rt, s.id, ["sh", "-c", "sleep 41 & sleep 42; echo never"], { timeoutMs: 1000 });
    expect(slow).toMatchObject({ timedOut: true, signal: "SIGKILL", exitCode: null, stdout: "" });
    expect(Date.now() - started).toBeLessThan(10_000);
    expect((await run(rt, s.id, ["ps"])).stdout).not.toMatch(/sleep 4[12]/);

    const trues: number[] = [];
    for (let i = 0; i < 20; i++) {
      const t = performance.now();
      expect((await run(rt, s.id, ["/bin/true"])).exitCode).toBe(0);
      trues.push(performance.now() - t);
    }
    timings.push(`exec /bin/true round trip: p50 ${median(trues).toFixed(1)} ms, max ${Math.max(...trues).toFixed(1)} ms over 20`);

    // A warm claim: paused, the guest cannot answer; resumed, it execs at once.
    await rt.pause(s.id);
    await expect(rt.exec(s.id, req(["true"]), () => {})).rejects.toMatchObject({ name: "RuntimeError", message: expect.stringMatching(/is paused/) });
    const resumed = performance.now();
    await rt.resume(s.id);
    expect((await run(rt, s.id, ["true"])).exitCode).toBe(0);
    timings.push(`resume → first exec done: ${(performance.now() - resumed).toFixed(1)} ms`);

    await rt.stop(s.id);
    await expect(rt.exec(s.id, req(["true"]), () => {})).rejects.toMatchObject({
      name: "RuntimeError",
      retryable: false,
      message: expect.stringMatching(/is stopped/),
    });
  }, 240_000);

  it("refuses exec where the guest has no agent: none running in it, or no channel for one", async () => {
    const s = spec(plain, { image: { url: server.url("base.qcow2"), sha256: plainGuest.sha256, format: "qcow2" } });
    await plain.create(s);
    await plain.start(s.id);
    const started = Date.now();
    const err = await plain.exec(s.id, req(["true"]), () => {}).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RuntimeError);
    expect(err).toMatchObject({ retryable: false, message: expect.stringMatching(/has no QEMU guest agent connected after 3 s/) });
    expect(Date.now() - started).toBeLessThan(8000);

    // The same domain defined without the agent's channel: refused at once.
    await plain.stop(s.id);
    const xml = (await virsh("dumpxml", "--inactive", s.id)).replace(/<channel type='unix'>[\s\S]*?<\/channel>/, "");
    const file = join(root, "nochannel.xml");
    writeFileSync(file, xml);
    await virsh("define", file);
    await plain.start(s.id);
    const at = Date.now();
    await expect(plain.exec(s.id, req(["true"]), () => {})).rejects.toMatchObject({
      retryable: false,
      message: expect.stringMatching(/has no QEMU guest agent: its domain has no agent channel/),
    });
    expect(Date.now() - at).toBeLessThan(2000);
    await plain.remove(s.id);
  }, 120_000);

  it("makes a new domain from another's snapshot: paused at the saved point, counting on from there, with its own name, MAC, tap and disk", async () => {
    const src = spec(rt, { env: { WHO: "source" } });
    await rt.create(src);
    await rt.start(src.id);
    await booted(rt, src.id);
    await until("the source to count past 20", async () => (await counter(src.id)) > 20, 60_000, 100);
    // An exec running across the snapshot (the save has the domain off for a moment) carries on after it.
    const across = run(rt, src.id, ["sh", "-c", "sleep 2; echo survived"]);
    const before = await counter(src.id);
    await rt.snapshot(src.id, "snap_warm");
    const after = await counter(src.id); // the snapshot saved a value between these two
    expect(await across).toMatchObject({ exitCode: 0, stdout: "survived\n" });
    // The source counts on; the clone must not start from where the source has got to, nor from 0.
    await until("the source to count on", async () => (await counter(src.id)) > after + 30, 60_000, 100);

    const clone = spec(rt, { env: { WHO: "clone" }, fromSnapshot: { instanceId: src.id, snapshotId: "snap_warm" } });
    let t = performance.now();
    await rt.create(clone);
    expect(await stateOf(rt, clone.id)).toBe("paused");
    await rt.resume(clone.id);
    const createResumeMs = performance.now() - t;
    const cloned = await counter(clone.id);
    timings.push(`fromSnapshot create + resume: ${createResumeMs.toFixed(0)} ms (first exec after it: counter ${cloned})`);
    expect(cloned).toBeGreaterThanOrEqual(before);
    expect(cloned).toBeLessThanOrEqual(after + 20);
    expect(cloned).toBeLessThan(await counter(src.id));
    await until("the clone to count on", async () => (await counter(clone.id)) > cloned, 10_000, 100);
    expect((await run(rt, clone.id, ["sh", "-c", 'echo "$WHO"'])).stdout).toBe("clone\n");

    // Its own identity: name, uuid, MAC and tap (on the bridge beside the source's), and its own disk.
    const xmlOf = (id: string) => virsh("dumpxml", id);
    const [srcXml, cloneXml] = await Promise.all([xmlOf(src.id), xmlOf(clone.id)]);
    expect(cloneXml).toContain(`<name>${clone.id}</name>`);
    expect(cloneXml).toContain(`<mac address='${clone.nic.mac}'/>`);
    expect(cloneXml).toContain(`<target dev='${tapFor(clone.id)}'/>`);
    expect(cloneXml).toContain(`<source file='${rt.overlayPath(clone.id)}'`);
    expect(cloneXml).not.toContain(src.id);
    expect(/<uuid>([^<]+)<\/uuid>/.exec(cloneXml)?.[1]).not.toBe(/<uuid>([^<]+)<\/uuid>/.exec(srcXml)?.[1]);
    const members = (await bridge.members()).join("\n");
    expect(members).toContain(tapFor(src.id));
    expect(members).toContain(tapFor(clone.id));
    expect(await virsh("list", "--persistent", "--name")).toContain(clone.id);

    // Again: nothing happens. From a snapshot this host lacks: refused.
    await rt.create(clone);
    expect(await stateOf(rt, clone.id)).toBe("running");
    const unknown = spec(rt, { fromSnapshot: { instanceId: src.id, snapshotId: "snap_never" } });
    await expect(rt.create(unknown)).rejects.toMatchObject({
      name: "RuntimeError",
      retryable: false,
      message: expect.stringMatching(/no snapshot snap_never/),
    });
    expect(await stateOf(rt, unknown.id)).toBeUndefined();

    // The same files restored by libvirt alone, as the source itself (nothing to rename), for comparison.
    await rt.stop(src.id);
    t = performance.now();
    await virsh("restore", join(rt.snapshotDir(src.id, "snap_warm"), "memory.save"), "--paused");
    timings.push(`bare virsh restore --paused of the same snapshot: ${(performance.now() - t).toFixed(0)} ms`);

    // The source gone with its snapshots, the clone runs on.
    await rt.remove(src.id);
    expect((await run(rt, clone.id, ["true"])).exitCode).toBe(0);
    await rt.stop(clone.id);
    await rt.start(clone.id);
    await booted(rt, clone.id);
  }, 240_000);
});
