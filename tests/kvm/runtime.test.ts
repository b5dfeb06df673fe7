import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLibvirtRuntime, type LibvirtRuntimeExtras } from "../../agent/runtimes/libvirt-kvm/index.ts";
import { type Runtime, RuntimeError } from "../../agent/runtimes/runtime.ts";
import { type InstanceSpec, tapFor } from "../../contracts/host.ts";
import { testKey, until } from "../support/fixtures.ts";
import { buildGuest, type Guest } from "./guest.ts";
import {
  fileSha256,
  guestSaid,
  keyBlobSha256,
  loopbackSources,
  makeBridge,
  openPath,
  readFromDisk,
  requireHypervisor,
  serveFiles,
  sh,
  ticksSince,
  tinySpec,
  virsh,
} from "./support.ts";

/** The libvirt-kvm runtime on the real libvirtd and QEMU of this machine, with a guest built from Debian packages. */

let guest: Guest;
let rt: Runtime & LibvirtRuntimeExtras;
let server: Awaited<ReturnType<typeof serveFiles>>;
let bridge: Awaited<ReturnType<typeof makeBridge>>;
const root = mkdtempSync(join(tmpdir(), "bc-kvm-rt-"));
const made: string[] = [];

beforeAll(async () => {
  await requireHypervisor();
  guest = await buildGuest();
  // A base whose bytes differ from what is registered (an image naming a backing file: tests/conformance/runtime.ts).
  const tampered = join(root, "tampered.qcow2");
  copyFileSync(guest.base, tampered);
  writeFileSync(tampered, Buffer.from("tampered"), { flag: "r+" });
  server = await serveFiles({ "base.qcow2": guest.base, "tampered.qcow2": tampered });
  bridge = await makeBridge(`bcrt${process.pid % 10000}`);
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
function spec(over: Partial<InstanceSpec> = {}): InstanceSpec {
  const id = `inst_kvmrt${"abcdefgh"[n++ % 8]}${process.pid.toString(32).replace(/[^a-z2-7]/g, "a")}`;
  made.push(id);
  const base = tinySpec(id, { url: server.url("base.qcow2"), sha256: guest.sha256, bridge: bridge.name, mac: `52:54:00:4b:00:0${n}` });
  return {
    ...base,
    sshKeys: [testKey("kvm@test")],
    userData: "#!/bin/sh\necho hello",
    hostname: "kvm-guest",
    nic: { ...base.nic, address: "10.123.0.2", prefix: 24 },
    ...over,
  };
}

const stateOf = async (id: string) => (await rt.list()).find((d) => d.id === id)?.state;

describe(`libvirt-kvm on this machine's libvirtd`, () => {
  it("boots a guest from a verified base, with its seed, NIC on the bridge and a disk of its own; stops, pauses, snapshots, restores and removes it", async () => {
    const s = spec();
    await rt.create(s);
    expect(await stateOf(s.id)).toBe("stopped");
    await rt.start(s.id);
    // The tap joins the bridge as the domain starts, before the guest runs anything.
    expect((await bridge.members()).some((l) => l.includes(`${tapFor(s.id)}:`))).toBe(true);
    await until("the guest to be ready", () => "ready" in guestSaid(rt.consolePath(s.id)), 120_000, 100);
    const said = guestSaid(rt.consolePath(s.id));
    expect(said["instance-id"]).toEqual([s.id]);
    expect(said.hostname).toEqual(["kvm-guest"]);
    expect(said["ssh-key-sha256"]).toEqual([keyBlobSha256(s.sshKeys[0] as string)]);
    expect(said.mac).toEqual([s.nic.mac]);
    expect(said.error).toBeUndefined();
    expect((await rt.list()).find((d) => d.id === s.id)).toMatchObject({ state: "running", shape: { vcpus: 1, memoryMib: 256, diskGib: 1 } });

    // Another runtime on the same libvirtd (another agent, another tool) neither sees nor touches it.
    const other = await createLibvirtRuntime({ stateDir: join(root, "other"), imageSources: loopbackSources });
    expect((await other.list()).map((d) => d.id)).not.toContain(s.id);
    await other.remove(s.id);
    await other.close();
    expect(await stateOf(s.id)).toBe("running");

    await rt.pause(s.id);
    expect(await stateOf(s.id)).toBe("paused");
    await rt.resume(s.id);
    expect(await stateOf(s.id)).toBe("running");
    // Defined again from outside, under a new UUID: the handle the runtime kept from its last lookup names a
    // domain that is gone, and a pause finds the new one instead of failing on it.
    const before = await virsh("domuuid", s.id);
    const xmlPath = join(root, "redefined.xml");
    writeFileSync(xmlPath, (await virsh("dumpxml", "--inactive", s.id)).replace(/<uuid>[^<]*<\/uuid>/, ""));
    await virsh("destroy", s.id);
    await virsh("undefine", s.id);
    await virsh("define", xmlPath);
    await virsh("start", s.id);
    expect(await virsh("domuuid", s.id)).not.toBe(before);
    await rt.pause(s.id);
    expect(await stateOf(s.id)).toBe("paused");
    await rt.resume(s.id);
    expect(await stateOf(s.id)).toBe("running");

    // A snapshot is kept with the instance and leaves it in the power state it had, running or paused.
    const { sizeBytes } = await rt.snapshot(s.id, "snap_running");
    expect(await stateOf(s.id)).toBe("running");
    const snapDir = rt.snapshotDir(s.id, "snap_running");
    expect(readdirSync(snapDir).sort()).toEqual(["disk.qcow2", "memory.save", "power"]);
    expect(sizeBytes).toBe(readdirSync(snapDir).reduce((n, f) => n + statSync(join(snapDir, f)).size, 0));
    const saved = statSync(join(snapDir, "memory.save")).mtimeMs;
    expect(await rt.snapshot(s.id, "snap_running")).toEqual({ sizeBytes }); // once per id: not saved again
    expect(statSync(join(snapDir, "memory.save")).mtimeMs).toBe(saved);
    await rt.pause(s.id);
    await rt.snapshot(s.id, "snap_paused");
    expect(await stateOf(s.id)).toBe("paused");

    await expect(rt.restore(s.id, "snap_never")).rejects.toMatchObject({ name: "RuntimeError", retryable: false });
    // A snapshot whose disk now stands on anything but this host's verified base is refused before the domain
    // or its overlay is touched.
    const foreign = join(root, "foreign.qcow2");
    await sh("qemu-img", ["create", "-q", "-f", "qcow2", foreign, "1G"]);
    const pausedDisk = join(rt.snapshotDir(s.id, "snap_paused"), "disk.qcow2");
    await sh("qemu-img", ["rebase", "-u", "-F", "qcow2", "-b", foreign, pausedDisk]);
    const overlayBefore = fileSha256(rt.overlayPath(s.id));
    await expect(rt.restore(s.id, "snap_paused")).rejects.toThrow(/not on a verified base of this host; refused/);
    expect(await stateOf(s.id)).toBe("paused");
    expect(fileSha256(rt.overlayPath(s.id))).toBe(overlayBefore);
    const cachedBase = join(root, "state", "images", `${guest.sha256}.qcow2`);
    await sh("qemu-img", ["rebase", "-u", "-F", "qcow2", "-b", cachedBase, pausedDisk]);
    await rt.restore(s.id, "snap_paused"); // over a paused domain
    expect(await stateOf(s.id)).toBe("paused");
    await rt.resume(s.id);
    await rt.restore(s.id, "snap_running"); // over a running one, stopped hard: it is being reverted anyway
    expect(await stateOf(s.id)).toBe("running");

    // This guest ignores the power button: stop waits its bound, then pulls the plug.
    await rt.stop(s.id);
    expect(await stateOf(s.id)).toBe("stopped");
    await expect(rt.snapshot(s.id, "snap_stopped")).rejects.toMatchObject({ name: "RuntimeError", retryable: false });
    expect(await readFromDisk(rt.overlayPath(s.id), `/bc-${s.id}`, join(root, "disk.raw"))).toContain(s.id);
    expect(fileSha256(guest.base)).toBe(guest.sha256);
    expect(readdirSync(join(root, "state", "images"))).toEqual([`${guest.sha256}.qcow2`]);

    await rt.remove(s.id);
    expect(await stateOf(s.id)).toBeUndefined();
    expect(await virsh("list", "--all", "--name")).not.toContain(s.id);
    expect(existsSync(join(root, "state", "instances", s.id))).toBe(false);
  }, 300_000);

  it("restores memory and disk as snapshotted: the guest's in-memory counter goes on from the snapshot, not from where it had got to", async () => {
    const s = spec();
    const log = () => rt.consolePath(s.id);
    const top = (from = 0) => Math.max(0, ...ticksSince(log(), from));
    await rt.create(s);
    await rt.start(s.id);
    // Five ticks at least, so a guest that booted afresh (counting from 1) could not pass for a restored one.
    await until("the guest to count", () => top() >= 5, 120_000, 100);
    const beforeSnapshot = top();
    await rt.snapshot(s.id, "snap_point");
    const atSnapshot = top(); // the snapshot was taken at or before this tick
    expect(await stateOf(s.id)).toBe("running");
    await until("the guest to count on after the snapshot", () => top() > atSnapshot + 5, 60_000, 100);

    // Paused, the guest prints nothing more; stopped and grown, its disk differs from the snapshot's.
    await rt.pause(s.id);
    const highest = top();
    await rt.stop(s.id);
    await rt.resize(s.id, { vcpus: 1, memoryMib: 256, diskGib: 2 });
    expect((await rt.list()).find((d) => d.id === s.id)?.shape.diskGib).toBe(2);

    const mark = statSync(log()).size;
    await rt.restore(s.id, "snap_point");
    expect(await stateOf(s.id)).toBe("running");
    expect((await rt.list()).find((d) => d.id === s.id)?.shape.diskGib).toBe(1);
    await until("the restored guest to count", () => ticksSince(log(), mark).length >= 5, 60_000, 100);
    const after = ticksSince(log(), mark);
    expect(after[0]).toBeGreaterThan(beforeSnapshot);
    expect(after[0]).toBeLessThanOrEqual(atSnapshot + 2);
    expect(after[0]).toBeLessThan(highest - 2);
    expect(after).toEqual(after.map((_, i) => (after[0] as number) + i));
    // Not a boot: the restored guest never says ready again.
    expect(readFileSync(log()).subarray(mark).toString("utf8")).not.toContain("BC-GUEST ready");

    // What an agent that died halfway through a snapshot leaves: the domain saved (off), the memory in the
    // snapshot's partial directory, and the runtime's note of it. The command, run again, finishes it.
    const partial = `${rt.snapshotDir(s.id, "snap_crash")}.partial`;
    mkdirSync(partial, { recursive: true });
    await virsh("save", s.id, join(partial, "memory.save"));
    writeFileSync(join(dirname(rt.overlayPath(s.id)), "saving.json"), JSON.stringify({ snapshotId: "snap_crash", power: "running" }));
    const beforeCrash = top(mark);
    expect(await stateOf(s.id)).toBe("stopped");
    const resumed = statSync(log()).size;
    const { sizeBytes } = await rt.snapshot(s.id, "snap_crash");
    expect(await stateOf(s.id)).toBe("running");
    expect(readdirSync(rt.snapshotDir(s.id, "snap_crash")).sort()).toEqual(["disk.qcow2", "memory.save", "power"]);
    expect(sizeBytes).toBeGreaterThan(0);
    expect(existsSync(partial)).toBe(false);
    await until("the guest to count on after the interrupted snapshot", () => ticksSince(log(), resumed).length >= 2, 60_000, 100);
    const carriedOn = ticksSince(log(), resumed)[0] as number;
    expect(carriedOn).toBeGreaterThan(beforeCrash);
    expect(carriedOn).toBeLessThanOrEqual(beforeCrash + 2);
  }, 300_000);

  it("refuses an image whose bytes do not match its sha256, and keeps nothing of it", async () => {
    // A host of its own, so the good base is not already in its cache under that digest.
    const fresh = await createLibvirtRuntime({ stateDir: join(root, "fresh"), imageSources: loopbackSources });
    try {
      const s = spec({ image: { url: server.url("tampered.qcow2"), sha256: guest.sha256, format: "qcow2" } });
      const err = await fresh.create(s).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(RuntimeError);
      expect((err as RuntimeError).retryable).toBe(false);
      expect((err as Error).message).toBe("image digest mismatch");
      expect(readdirSync(join(root, "fresh", "images"))).toEqual([]);
      expect((await fresh.list()).map((d) => d.id)).not.toContain(s.id);
    } finally {
      await fresh.close();
    }
  });

  it("refuses the loopback image server without the operator's allowance, and never fetches from it", async () => {
    const guarded = await createLibvirtRuntime({ stateDir: join(root, "guarded") });
    try {
      const s = spec();
      const err = await guarded.create(s).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(RuntimeError);
      expect((err as RuntimeError).retryable).toBe(false);
      expect((err as Error).message).toBe("image source refused: plain http is not allowed");
      const https = spec({ image: { ...s.image, url: s.image.url.replace(/^http:/, "https:") } });
      expect(((await guarded.create(https).catch((e: unknown) => e)) as Error).message).toBe("image source refused: loopback destination");
      expect(existsSync(join(root, "guarded", "images")) ? readdirSync(join(root, "guarded", "images")) : []).toEqual([]);
      expect((await guarded.list()).map((d) => d.id)).not.toContain(s.id);
    } finally {
      await guarded.close();
    }
  });
});
