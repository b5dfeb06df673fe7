import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Converger } from "../../agent/converge.ts";
import { createLibvirtRuntime, type LibvirtRuntimeExtras } from "../../agent/runtimes/libvirt-kvm/index.ts";
import type { Runtime } from "../../agent/runtimes/runtime.ts";
import type { InstanceSpec, NodeSpec } from "../../contracts/host.ts";
import { until } from "../support/fixtures.ts";
import { buildGuest, type Guest } from "./guest.ts";
import { guestSaid, loopbackSources, makeBridge, openPath, requireHypervisor, serveFiles, sh, tinySpec, virsh } from "./support.ts";

/**
 * Crashes on this machine's real libvirtd and QEMU, seen through the libvirt-kvm runtime and the agent's
 * converger. Two kinds: QEMU itself dies (libvirt: shut off, reason crashed), and the guest signals a panic
 * on its pvpanic device (libvirt: crashed, kept by on_crash=preserve). The test guest's kernel has pvpanic
 * only as a module its tiny init does not load, so the panic is signalled the way that driver does it, by a
 * write to the device's port, from QEMU's monitor: what libvirt and the runtime see from there is real.
 */

let guest: Guest;
let rt: Runtime & LibvirtRuntimeExtras;
let server: Awaited<ReturnType<typeof serveFiles>>;
let bridge: Awaited<ReturnType<typeof makeBridge>>;
const root = mkdtempSync(join(tmpdir(), "bc-kvm-crash-"));
const made: string[] = [];

beforeAll(async () => {
  await requireHypervisor();
  guest = await buildGuest();
  server = await serveFiles({ "base.qcow2": guest.base });
  bridge = await makeBridge(`bccr${process.pid % 10000}`);
  await openPath(root);
  await openPath(guest.kernel);
  rt = (await createLibvirtRuntime({
    stateDir: join(root, "state"),
    boot: { kernel: guest.kernel, initrd: guest.initrd, cmdline: guest.cmdline },
    shutdownTimeoutMs: 1500,
    imageSources: loopbackSources,
  })) as Runtime & LibvirtRuntimeExtras;
}, 300_000);

afterAll(async () => {
  for (const id of made) await rt?.remove(id).catch(() => {});
  await rt?.close();
  await bridge?.remove();
  await server?.close();
  rmSync(root, { recursive: true, force: true });
});

let n = 0;
function spec(): InstanceSpec {
  const id = `inst_kvmcr${"abcdefgh"[n++ % 8]}${process.pid.toString(32).replace(/[^a-z2-7]/g, "a")}`;
  made.push(id);
  return tinySpec(id, { url: server.url("base.qcow2"), sha256: guest.sha256, bridge: bridge.name, mac: `52:54:00:4c:00:0${n}` });
}

const stateOf = async (id: string) => (await rt.list()).find((d) => d.id === id)?.state;
const readyCount = (id: string) => guestSaid(rt.consolePath(id)).ready?.length ?? 0;
const nodeSpec = (s: InstanceSpec, power: InstanceSpec["power"], generation: number): NodeSpec => ({
  nodeId: "node_crash",
  generation,
  runtime: "libvirt-kvm",
  instances: [{ ...s, power }],
  remove: [],
});

async function booted(s: InstanceSpec): Promise<void> {
  const before = readyCount(s.id);
  await rt.start(s.id);
  await until("the guest to be ready", () => readyCount(s.id) > before, 120_000, 100);
}

describe("crashes under real libvirt", () => {
  it("defines domains that keep a crash for the platform to see, with a panic device", async () => {
    const s = spec();
    await rt.create(s);
    const xml = await virsh("dumpxml", "--inactive", s.id);
    expect(xml).toContain("<on_crash>preserve</on_crash>");
    expect(xml).toMatch(/<panic model='isa'/);
  });

  it("a guest that panics is reported crashed, left so while its spec says running, and boots afresh when started", async () => {
    const s = spec();
    await rt.create(s);
    await booted(s);
    const converger = new Converger(rt);
    // The guest's pvpanic write (what its driver does in a panic), from QEMU's monitor.
    await virsh("qemu-monitor-command", s.id, "--hmp", "o /b 0x505 1");
    await until("libvirt to show the domain crashed", async () => (await virsh("domstate", "--reason", s.id)).includes("crashed (panicked)"), 30_000, 100);
    expect(await stateOf(s.id)).toBe("crashed");
    const report = await converger.report(1);
    expect(report.instances.find((i) => i.id === s.id)).toMatchObject({ state: "crashed", error: "libvirt-kvm: the guest crashed" });

    // A pass that still wants it running does not boot over the crash: the server decides what follows.
    await converger.converge(nodeSpec(s, "running", 1));
    expect(await stateOf(s.id)).toBe("crashed");
    // The server puts it in error, which the host holds stopped; then it is started again.
    await converger.converge(nodeSpec(s, "stopped", 2));
    expect(await stateOf(s.id)).toBe("stopped");
    const before = readyCount(s.id);
    await converger.converge(nodeSpec(s, "running", 3));
    expect(await stateOf(s.id)).toBe("running");
    await until("the guest to boot again", () => readyCount(s.id) > before, 120_000, 100);
  });

  it("a QEMU that dies is reported crashed, not stopped; a domain destroyed from outside reads stopped", async () => {
    const s = spec();
    await rt.create(s);
    await booted(s);
    expect(await stateOf(s.id)).toBe("running");
    const pid = readFileSync(`/run/libvirt/qemu/${s.id}.pid`, "utf8").trim();
    await sh("kill", ["-SEGV", pid]);
    await until("libvirt to see QEMU gone", async () => (await virsh("domstate", "--reason", s.id)).includes("shut off (crashed)"), 30_000, 100);
    expect(await stateOf(s.id)).toBe("crashed");
    // Reported so until the runtime acts on it.
    expect(await stateOf(s.id)).toBe("crashed");
    await rt.stop(s.id);
    expect(await stateOf(s.id)).toBe("stopped");

    await booted(s);
    expect(await stateOf(s.id)).toBe("running");
    await virsh("destroy", s.id);
    expect(await virsh("domstate", "--reason", s.id)).toContain("shut off (destroyed)");
    expect(await stateOf(s.id)).toBe("stopped");
  });
});
