import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { libvirtKvm } from "../../agent/runtimes/registry.ts";
import type { Runtime } from "../../agent/runtimes/runtime.ts";
import type { InstanceSpec } from "../../contracts/host.ts";
import { runtimeConformance } from "../conformance/runtime.ts";
import { until } from "../support/fixtures.ts";
import { buildAgentGuest, fileSha256, loopbackSources, makeBridge, openPath, requireHypervisor, serveFiles, sh } from "./support.ts";

/**
 * The runtime conformance suite (tests/conformance/runtime.ts) on this machine's libvirtd and QEMU, as
 * `bc agent --runtime libvirt-kvm` makes the runtime: the test guest with the QEMU guest agent (./support.ts),
 * booted by direct kernel boot from a base served on loopback, its NIC on a bridge of its own.
 */

runtimeConformance({ declaration: libvirtKvm, timeoutMs: 240_000, setupTimeoutMs: 300_000 }, async () => {
  await requireHypervisor();
  const guest = await buildAgentGuest();
  const root = await mkdtemp(join(tmpdir(), "bc-conformance-kvm-"));
  // A qcow2 that names a file of this host as its backing file: what a tenant's image must never make a host open.
  const backed = join(root, "backed.qcow2");
  await sh("qemu-img", ["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", guest.base, backed, "1G"]);
  const server = await serveFiles({ "base.qcow2": guest.base, "backed.qcow2": backed });
  const bridge = await makeBridge(`bccf${process.pid % 10000}`);
  await openPath(root);
  await openPath(guest.kernel);
  await openPath(guest.initrd);
  const stateDir = join(root, "agent");
  // Where the declaration puts the runtime's files under the agent's state dir.
  const instanceDir = (id: string) => join(stateDir, "libvirt", "instances", id);
  let macs = 0;
  const spec = (id: string, over: Partial<InstanceSpec> = {}): InstanceSpec => ({
    id,
    power: "running",
    vcpus: 1,
    memoryMib: 256,
    diskGib: 1,
    gpus: [],
    image: { url: server.url("base.qcow2"), sha256: guest.sha256, format: "qcow2" },
    sshKeys: [],
    userData: null,
    hostname: id,
    nic: { bridge: bridge.name, mac: `52:54:00:cf:00:${(++macs % 256).toString(16).padStart(2, "0")}`, address: null, prefix: null, gateway: null },
    env: {},
    network: { egress: "all", allow: [] },
    fromSnapshot: null,
    ...over,
  });
  return {
    open: async () =>
      libvirtKvm.make({
        stateDir,
        libvirt: {
          boot: { kernel: guest.kernel, initrd: guest.initrd, cmdline: guest.cmdline },
          // This guest ignores the power button: a stop waits this long, then pulls the plug.
          shutdownTimeoutMs: 500,
          imageSources: loopbackSources,
          agentWaitMs: 3000,
        },
      }),
    spec,
    files: (id: string) => ({ overlay: join(instanceDir(id), "overlay.qcow2"), seed: join(instanceDir(id), "seed.iso") }),
    // QEMU dies under the guest: libvirt shows the domain shut off, reason crashed.
    crash: async (id: string) => void (await sh("kill", ["-SEGV", readFileSync(`/run/libvirt/qemu/${id}.pid`, "utf8").trim()])),
    // Booted, with its guest agent answering (a restored guest's agent reconnects first).
    ready: (rt: Runtime, id: string) =>
      until(
        "the guest's agent to answer",
        async () => (await rt.exec(id, { command: ["true"], env: {}, stdin: null, timeoutMs: 10_000 }, () => {}).catch(() => null))?.exitCode === 0,
        120_000,
        100,
      ),
    backedImage: (id: string) => spec(id, { image: { url: server.url("backed.qcow2"), sha256: fileSha256(backed), format: "qcow2" } }),
    close: async () => {
      await bridge.remove();
      await server.close();
      await rm(root, { recursive: true, force: true });
    },
  };
});
