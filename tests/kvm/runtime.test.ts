import { copyFileSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLibvirtRuntime, type LibvirtRuntimeExtras } from "../../agent/runtimes/libvirt-kvm/index.ts";
import { type Runtime, RuntimeError } from "../../agent/runtimes/runtime.ts";
import type { InstanceSpec } from "../../contracts/host.ts";
import { testKey, until } from "../support/fixtures.ts";
import { buildGuest, type Guest } from "./guest.ts";
import { fileSha256, guestSaid, keyBlobSha256, makeBridge, openPath, readFromDisk, requireHypervisor, serveFiles, sh, tinySpec, virsh } from "./support.ts";

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
  // A base whose bytes differ from what is registered, and a qcow2 that names a file of the host as backing.
  const tampered = join(root, "tampered.qcow2");
  copyFileSync(guest.base, tampered);
  writeFileSync(tampered, Buffer.from("tampered"), { flag: "r+" });
  const backed = join(root, "backed.qcow2");
  await sh("qemu-img", ["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", guest.base, backed, "1G"]);
  server = await serveFiles({ "base.qcow2": guest.base, "tampered.qcow2": tampered, "backed.qcow2": backed });
  bridge = await makeBridge(`bcrt${process.pid % 10000}`);
  await openPath(root);
  await openPath(guest.kernel);
  rt = (await createLibvirtRuntime({
    stateDir: join(root, "state"),
    boot: { kernel: guest.kernel, initrd: guest.initrd, cmdline: guest.cmdline },
    shutdownTimeoutMs: 1500,
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
  it("boots a guest from a verified base, with its seed, NIC on the bridge and a disk of its own; stops, pauses, saves, restores and removes it", async () => {
    const s = spec();
    await rt.create(s);
    expect(await stateOf(s.id)).toBe("stopped");
    await rt.start(s.id);
    // The tap joins the bridge as the domain starts, before the guest runs anything.
    expect((await bridge.members()).some((l) => l.includes("vnet"))).toBe(true);
    await until("the guest to be ready", () => "ready" in guestSaid(rt.consolePath(s.id)), 120_000, 100);
    const said = guestSaid(rt.consolePath(s.id));
    expect(said["instance-id"]).toEqual([s.id]);
    expect(said.hostname).toEqual(["kvm-guest"]);
    expect(said["ssh-key-sha256"]).toEqual([keyBlobSha256(s.sshKeys[0] as string)]);
    expect(said.mac).toEqual([s.nic.mac]);
    expect(said.error).toBeUndefined();
    expect((await rt.list()).find((d) => d.id === s.id)).toMatchObject({ state: "running", shape: { vcpus: 1, memoryMib: 256, diskGib: 1 } });

    // Another runtime on the same libvirtd (another agent, another tool) neither sees nor touches it.
    const other = await createLibvirtRuntime({ stateDir: join(root, "other") });
    expect((await other.list()).map((d) => d.id)).not.toContain(s.id);
    await other.remove(s.id);
    await other.close();
    expect(await stateOf(s.id)).toBe("running");

    await rt.pause(s.id);
    expect(await stateOf(s.id)).toBe("paused");
    await rt.resume(s.id);
    expect(await stateOf(s.id)).toBe("running");

    const memory = join(root, `${s.id}.mem`);
    await rt.snapshot(s.id, memory);
    expect(await stateOf(s.id)).toBe("stopped");
    // A disk that now stands on anything but this host's verified base is refused before it is restored.
    const foreign = join(root, "foreign.qcow2");
    await sh("qemu-img", ["create", "-q", "-f", "qcow2", foreign, "1G"]);
    await sh("qemu-img", ["rebase", "-u", "-F", "qcow2", "-b", foreign, rt.overlayPath(s.id)]);
    await expect(rt.restore(s.id, memory)).rejects.toThrow(/not on a verified base of this host; refused/);
    const cachedBase = join(root, "state", "images", `${guest.sha256}.qcow2`);
    await sh("qemu-img", ["rebase", "-u", "-F", "qcow2", "-b", cachedBase, rt.overlayPath(s.id)]);
    await rt.restore(s.id, memory);
    expect(await stateOf(s.id)).toBe("running");

    // This guest ignores the power button: stop waits its bound, then pulls the plug.
    await rt.stop(s.id);
    expect(await stateOf(s.id)).toBe("stopped");
    expect(await readFromDisk(rt.overlayPath(s.id), `/bc-${s.id}`, join(root, "disk.raw"))).toContain(s.id);
    expect(fileSha256(guest.base)).toBe(guest.sha256);
    expect(readdirSync(join(root, "state", "images"))).toEqual([`${guest.sha256}.qcow2`]);

    await rt.remove(s.id);
    expect(await stateOf(s.id)).toBeUndefined();
    expect(await virsh("list", "--all", "--name")).not.toContain(s.id);
    expect(existsSync(join(root, "state", "instances", s.id))).toBe(false);
  }, 300_000);

  it("refuses an image whose bytes do not match its sha256, and keeps nothing of it", async () => {
    // A host of its own, so the good base is not already in its cache under that digest.
    const fresh = await createLibvirtRuntime({ stateDir: join(root, "fresh") });
    try {
      const s = spec({ image: { url: server.url("tampered.qcow2"), sha256: guest.sha256, format: "qcow2" } });
      const err = await fresh.create(s).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(RuntimeError);
      expect((err as RuntimeError).retryable).toBe(false);
      expect((err as Error).message).toMatch(/sha256 [0-9a-f]{64}, not the registered/);
      expect(readdirSync(join(root, "fresh", "images"))).toEqual([]);
      expect((await fresh.list()).map((d) => d.id)).not.toContain(s.id);
    } finally {
      await fresh.close();
    }
  });

  it("refuses an image that names a backing file", async () => {
    const s = spec({ image: { url: server.url("backed.qcow2"), sha256: fileSha256(join(root, "backed.qcow2")), format: "qcow2" } });
    const err = await rt.create(s).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RuntimeError);
    expect((err as Error).message).toMatch(/names a backing file/);
    expect(await stateOf(s.id)).toBeUndefined();
  });
});
