import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CreateApiTokenDocument,
  CreateInstanceDocument,
  CreateTenantDocument,
  DeleteInstanceDocument,
  InstanceDocument,
  InstanceSnapshotDocument,
  PauseInstanceDocument,
  RegisterImageDocument,
  RestoreInstanceDocument,
  SnapshotInstanceDocument,
  StartInstanceDocument,
  StopInstanceDocument,
} from "../../sdk/client.ts";
import { type Cluster, startCluster } from "../e2e/processes.ts";
import { testKey } from "../support/fixtures.ts";
import { waitForState } from "../support/hosts.ts";
import { invariantViolations } from "../support/ledger.ts";
import { buildGuest, type Guest } from "./guest.ts";
import {
  fileSha256,
  guestSaid,
  keyBlobSha256,
  loopbackSourceFlags,
  makeBridge,
  openPath,
  readFromDisk,
  requireHypervisor,
  serveFiles,
  sh,
  ticksSince,
  virsh,
} from "./support.ts";

/** The whole platform on a real hypervisor: server, worker and one agent driving this machine's libvirtd. */

let c: Cluster;
let guest: Guest;
let server: Awaited<ReturnType<typeof serveFiles>>;
let bridge: Awaited<ReturnType<typeof makeBridge>>;

beforeAll(async () => {
  await requireHypervisor();
  guest = await buildGuest();
  await openPath(guest.kernel);
  bridge = await makeBridge(`bcpf${process.pid % 10000}`);
  c = await startCluster({
    hosts: 1,
    runtime: "libvirt-kvm",
    // The image server is on loopback, over http: the operator allows both, on the hosts and at registration.
    agentArgs: ["--kernel", guest.kernel, "--initrd", guest.initrd, "--cmdline", guest.cmdline, "--shutdown-timeout-ms", "1500", ...loopbackSourceFlags],
    // A real hypervisor under emulation on a busy machine: a host is called lost after 10 s of silence, not 1.5.
    env: { VPS_HOST_NETWORK: bridge.name, VPS_RUNTIMES: "libvirt-kvm", NODE_LOST_GRACE_MS: "10000", IMAGE_SOURCE_HTTP: "true" },
  });
  const backed = join(c.root, "backed.qcow2");
  await sh("qemu-img", ["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", guest.base, backed, "1G"]);
  const tampered = join(c.root, "tampered.qcow2");
  writeFileSync(tampered, "not the registered bytes");
  server = await serveFiles({ "base.qcow2": guest.base, "backed.qcow2": backed, "tampered.qcow2": tampered });
}, 300_000);

afterAll(async () => {
  const errors = c?.errors() ?? [];
  if (errors.length) console.error(`process errors:\n${errors.slice(0, 20).join("\n")}`);
  await c?.close();
  await bridge?.remove();
  await server?.close();
});

async function tenant() {
  const { createTenant } = await c.operator.request(CreateTenantDocument, { input: { name: `kvm-${Date.now()}` } });
  const { createApiToken } = await c.operator.request(CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "kvm" } });
  return c.client(createApiToken.token);
}

const registered = async (name: string, source: string, sha256: string) =>
  (await c.operator.request(RegisterImageDocument, { input: { name, source, sha256, format: "QCOW2", public: true } })).registerImage.id;
const image = (name: string, file: string, sha256: string) => registered(name, server.url(file), sha256);

const instanceDir = (id: string) => join(c.root, "host-1", "libvirt", "instances", id);

describe("server + worker + agent on libvirt-kvm", () => {
  it("runs an instance created through the SDK: its guest sees its own id and key; stop, pause, start and delete reach the hypervisor", async () => {
    const t = await tenant();
    const key = testKey("owner@laptop", 9);
    const imageId = await image("tiny", "base.qcow2", guest.sha256);
    const inst = (await t.request(CreateInstanceDocument, { input: { poolId: c.poolId, flavor: "tiny", imageId, sshKeys: [key] } })).createInstance;
    await waitForState(t, inst.id, "RUNNING", 180_000);
    const consoleLog = join(instanceDir(inst.id), "console.log");
    await expect.poll(() => "ready" in guestSaid(consoleLog), { timeout: 120_000, interval: 250 }).toBe(true);
    const said = guestSaid(consoleLog);
    expect(said["instance-id"]).toEqual([inst.id]);
    expect(said["ssh-key-sha256"]).toEqual([keyBlobSha256(key)]);
    expect(await virsh("domstate", inst.id)).toMatch(/running/);

    await t.request(PauseInstanceDocument, { id: inst.id });
    await waitForState(t, inst.id, "PAUSED", 60_000);
    expect(await virsh("domstate", inst.id)).toMatch(/paused/);
    await t.request(StartInstanceDocument, { id: inst.id });
    await waitForState(t, inst.id, "RUNNING", 60_000);

    await t.request(StopInstanceDocument, { id: inst.id });
    await waitForState(t, inst.id, "STOPPED", 60_000);
    expect(await virsh("domstate", inst.id)).toMatch(/shut off/);
    const overlay = join(instanceDir(inst.id), "overlay.qcow2");
    expect(await readFromDisk(overlay, `/bc-${inst.id}`, join(c.root, "disk.raw"))).toContain(inst.id);
    expect(fileSha256(guest.base)).toBe(guest.sha256);

    await t.request(DeleteInstanceDocument, { id: inst.id });
    await waitForState(t, inst.id, "DELETED", 60_000);
    expect(await virsh("list", "--all", "--name")).not.toContain(inst.id);
    await expect.poll(async () => (await sh("ls", [join(c.root, "host-1", "libvirt", "instances")])).includes(inst.id), { timeout: 10_000 }).toBe(false);
    await c.inspect(async (p) => expect(await invariantViolations(p)).toEqual([]));
  }, 600_000);

  it("snapshots a running guest through the API and restores it: the guest's counter carries on from the snapshot", async () => {
    const t = await tenant();
    const imageId = await image("tiny-snap", "base.qcow2", guest.sha256);
    const inst = (await t.request(CreateInstanceDocument, { input: { poolId: c.poolId, flavor: "tiny", imageId } })).createInstance;
    await waitForState(t, inst.id, "RUNNING", 180_000);
    const log = join(instanceDir(inst.id), "console.log");
    const top = (from = 0) => Math.max(0, ...ticksSince(log, from));
    // A few ticks first, so a guest that booted afresh (counting from 1) could not pass for a restored one.
    await expect.poll(() => top(), { timeout: 120_000, interval: 250 }).toBeGreaterThanOrEqual(5);

    const asked = top(); // the guest is saved after this tick
    const { snapshotInstance: snap } = await c.operator.request(SnapshotInstanceDocument, { id: inst.id });
    const snapshot = async () => (await c.operator.request(InstanceSnapshotDocument, { id: snap.id })).instanceSnapshot;
    await expect.poll(async () => (await snapshot())?.state, { timeout: 120_000, interval: 250 }).toBe("READY");
    const saved = top(); // ... and at or before this one
    expect((await snapshot())?.sizeBytes).toBeGreaterThan(0);
    expect((await t.request(InstanceDocument, { id: inst.id })).instance?.state).toBe("RUNNING");
    // It kept running after the snapshot, well past the point it was saved at.
    await expect.poll(() => top(), { timeout: 60_000, interval: 250 }).toBeGreaterThanOrEqual(saved + 8);

    const mark = readFileSync(log).length;
    const before = top();
    await c.operator.request(RestoreInstanceDocument, { id: inst.id, snapshotId: snap.id });
    // Ticks from the old run may still land after the mark before the host acts; the restored run starts
    // where the counter drops back.
    const restored = () => {
      const ticks = ticksSince(log, mark);
      const start = ticks.findIndex((v, i) => i > 0 && v < (ticks[i - 1] as number));
      return ticks[0] !== undefined && ticks[0] <= saved + 2 ? ticks : start < 0 ? [] : ticks.slice(start);
    };
    await expect.poll(() => restored().length, { timeout: 120_000, interval: 250 }).toBeGreaterThanOrEqual(3);
    const after = restored();
    // Carries on from the snapshot point: not from 1 (a fresh boot), not from where the guest had got to.
    expect(after[0]).toBeGreaterThan(asked);
    expect(after[0]).toBeLessThanOrEqual(saved + 2);
    expect(after[0]).toBeLessThan(before - 4);
    expect(after).toEqual(after.map((_, i) => (after[0] as number) + i));
    expect(guestSaid(log).ready).toHaveLength(1);
    expect(await virsh("domstate", inst.id)).toMatch(/running/);
    await expect.poll(async () => (await t.request(InstanceDocument, { id: inst.id })).instance?.state, { timeout: 60_000 }).toBe("RUNNING");

    await t.request(DeleteInstanceDocument, { id: inst.id });
    await waitForState(t, inst.id, "DELETED", 60_000);
    await expect.poll(async () => (await snapshot())?.state, { timeout: 30_000, interval: 250 }).toBe("DELETED");
    await c.inspect(async (p) => expect(await invariantViolations(p)).toEqual([]));
  }, 600_000);

  it("refuses a tampered image, one that names a backing file and one at the metadata endpoint, with a classified reason in a RuntimeError condition", async () => {
    const t = await tenant();
    const cases = [
      {
        imageId: await image(
          "tampered",
          "tampered.qcow2",
          guest.sha256.replace(/^./, (ch) => (ch === "0" ? "1" : "0")),
        ),
        reason: "image digest mismatch",
      },
      { imageId: await image("backed", "backed.qcow2", fileSha256(join(c.root, "backed.qcow2"))), reason: "image names a backing file; refused" },
      // Registered where the deployment takes http; the host allows loopback only, so it never connects there.
      // A digest of its own: the host's cache is by digest, and the guest's base is in it already.
      {
        imageId: await registered("metadata", "http://169.254.169.254/latest/meta-data/", "f".repeat(64)),
        reason: "image source refused: link-local destination",
      },
    ];
    for (const { imageId, reason } of cases) {
      const inst = (await t.request(CreateInstanceDocument, { input: { poolId: c.poolId, flavor: "tiny", imageId } })).createInstance;
      await waitForState(t, inst.id, "ERROR", 120_000);
      const { instance } = await t.request(InstanceDocument, { id: inst.id });
      expect(instance?.conditions.find((x) => x.type === "RuntimeError")?.message).toBe(reason);
      await t.request(DeleteInstanceDocument, { id: inst.id });
      await waitForState(t, inst.id, "DELETED", 60_000);
    }
    await c.inspect(async (p) => expect(await invariantViolations(p)).toEqual([]));
  }, 600_000);
});
