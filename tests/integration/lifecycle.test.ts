import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CreateFlavorDocument,
  CreateInstanceDocument,
  CreatePoolDocument,
  CreateProviderAccountDocument,
  DeleteInstanceDocument,
  type InstanceFieldsFragment,
  ProviderOffersDocument,
  ResizeInstanceDocument,
  StartInstanceDocument,
  StopInstanceDocument,
} from "../../sdk/client.ts";
import { expectCode, type Harness, startHarness } from "../support/harness.ts";
import { invariantViolations, ledger } from "../support/ledger.ts";
import { confirmDeleted, walk } from "../support/reconcile.ts";

let h: Harness;
beforeAll(async () => {
  h = await startHarness({ PROVIDERS: "hetzner-cloud" });
});
afterAll(() => h?.close());

type Tenant = Awaited<ReturnType<Harness["tenant"]>>;
const create = (t: Tenant, input: Record<string, unknown>) =>
  t.client.request(CreateInstanceDocument, { input: input as never }).then((r) => r.createInstance as InstanceFieldsFragment);
const events = (id: string) => h.platform.db.prisma.instanceEvent.findMany({ where: { instanceId: id }, orderBy: { version: "asc" } });

describe("start, stop, delete record intent only", () => {
  it("changes desiredState, bumps the version and writes one event per change; repeats change nothing", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const inst = await create(t, { poolId: pool.poolId, flavor: "small", imageId: pool.imageId });
    const stopped = (await t.client.request(StopInstanceDocument, { id: inst.id })).stopInstance;
    // Created, scheduled and placed in the create's own write (versions 1–3); each request adds one.
    expect(stopped).toMatchObject({ state: "PROVISIONING", desiredState: "STOPPED", version: 4 });
    expect((await t.client.request(StopInstanceDocument, { id: inst.id })).stopInstance.version).toBe(4);
    const started = (await t.client.request(StartInstanceDocument, { id: inst.id })).startInstance;
    expect(started).toMatchObject({ desiredState: "RUNNING", version: 5 });
    const deleted = (await t.client.request(DeleteInstanceDocument, { id: inst.id })).deleteInstance;
    expect(deleted).toMatchObject({ state: "PROVISIONING", desiredState: "DELETED", version: 6 });
    // Nothing is released until a host confirms the domain gone.
    expect(deleted.allocationId).not.toBeNull();
    expect((await t.client.request(DeleteInstanceDocument, { id: inst.id })).deleteInstance.version).toBe(6);
    await expectCode(t.client.request(StartInstanceDocument, { id: inst.id }), "PRECONDITION_FAILED");
    expect((await events(inst.id)).map((e) => [e.version, e.reason, e.toState, e.desiredState])).toEqual([
      [1, "created", "pending", "running"],
      [2, "schedule", "scheduling", "running"],
      [3, "placed", "provisioning", "running"],
      [4, "requested:stopped", "provisioning", "stopped"],
      [5, "requested:running", "provisioning", "running"],
      [6, "requested:deleted", "provisioning", "deleted"],
    ]);
    const audit = await h.platform.db.prisma.auditLog.findMany({ where: { targetId: inst.id }, orderBy: { id: "asc" } });
    expect(audit.map((a) => a.action)).toEqual(["createInstance", "stopInstance", "startInstance", "deleteInstance"]);
    await confirmDeleted(h.platform, inst.id);
    expect(await invariantViolations(h.platform)).toEqual([]);
  });

  it("needs the update and delete scopes", async () => {
    const t = await h.tenant({ scopes: ["compute:instances:create", "compute:instances:read"] });
    const pool = await h.hostedPool();
    const inst = await create(t, { poolId: pool.poolId, flavor: "small", imageId: pool.imageId });
    await expectCode(t.client.request(StopInstanceDocument, { id: inst.id }), "FORBIDDEN");
    await expectCode(t.client.request(DeleteInstanceDocument, { id: inst.id }), "FORBIDDEN");
    // Operators can act on any tenant's instance.
    expect((await h.operator.request(StopInstanceDocument, { id: inst.id })).stopInstance.desiredState).toBe("STOPPED");
  });
});

describe("resize", () => {
  let t: Tenant;
  let pool: Awaited<ReturnType<Harness["hostedPool"]>>;
  beforeAll(async () => {
    t = await h.tenant({ quota: { vcpus: 7 } });
    pool = await h.hostedPool({
      nodes: [
        {
          vcpus: 8,
          memoryMib: 32768,
          diskGib: 500,
          gpus: [
            { model: "nvidia-l40s", count: 1 },
            { model: "nvidia-a100", count: 1 },
          ],
        },
      ],
      flavors: [
        { name: "small", vcpus: 2, memoryMib: 2048, diskGib: 20 },
        { name: "medium", vcpus: 4, memoryMib: 4096, diskGib: 40 },
        { name: "large", vcpus: 8, memoryMib: 8192, diskGib: 80 },
        { name: "l40s", vcpus: 1, memoryMib: 1024, diskGib: 10, gpus: [{ model: "nvidia-l40s", count: 1 }] },
        { name: "a100", vcpus: 1, memoryMib: 1024, diskGib: 10, gpus: [{ model: "nvidia-a100", count: 1 }] },
      ],
    });
  });

  async function stoppedInstance(flavor: string, key: string) {
    const inst = await create(t, { poolId: pool.poolId, flavor, imageId: pool.imageId, desiredState: "STOPPED", idempotencyKey: key });
    await walk(h.platform, inst.id, ["scheduling", "provisioning", "stopped"]);
    return inst;
  }

  it("needs a stopped instance: PRECONDITION_FAILED otherwise, and nothing changes", async () => {
    const inst = await create(t, { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, idempotencyKey: "running" });
    const before = await ledger(h.platform);
    await expectCode(t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "medium" }), "PRECONDITION_FAILED");
    expect(await ledger(h.platform)).toEqual(before);
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await confirmDeleted(h.platform, inst.id);
  });

  it("moves the claim and the charge in place, on the same node", async () => {
    const inst = await stoppedInstance("small", "grow");
    const resized = (await t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "medium" })).resizeInstance;
    expect(resized).toMatchObject({ state: "RESIZING", flavor: "medium", vcpus: 4, memoryMib: 4096, nodeId: inst.nodeId });
    expect(resized.allocationId).not.toBe(inst.allocationId);
    const usage = await h.platform.db.prisma.quotaUsage.findUniqueOrThrow({ where: { tenantId_resource: { tenantId: t.id, resource: "vcpus" } } });
    expect(Number(usage.used)).toBe(4);
    expect(await invariantViolations(h.platform)).toEqual([]);
    await walk(h.platform, inst.id, ["stopped"]);
    // Unknown flavor, then one that does not fit the node alongside what it holds, then one over quota.
    await expectCode(t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "xxl" }), "NOT_FOUND");
    const other = await stoppedInstance("small", "neighbour");
    const before = await ledger(h.platform);
    const fit = await expectCode(t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "large" }), "UNSCHEDULABLE");
    expect(fit.message).toMatch(/its node/);
    expect(await ledger(h.platform)).toEqual(before);
    await t.client.request(DeleteInstanceDocument, { id: other.id });
    await confirmDeleted(h.platform, other.id);
    await expectCode(t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "large" }), "QUOTA_EXCEEDED");
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await confirmDeleted(h.platform, inst.id);
    expect(await invariantViolations(h.platform)).toEqual([]);
  });

  it("never shrinks a disk", async () => {
    const inst = await stoppedInstance("medium", "shrink");
    const before = await ledger(h.platform);
    const err = await expectCode(t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "small" }), "INVALID_INPUT");
    expect(err.message).toMatch(/cannot shrink the disk: medium has 40 GiB, small has 20 GiB/);
    expect(await ledger(h.platform)).toEqual(before);
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await confirmDeleted(h.platform, inst.id);
  });

  it("keeps the GPU count, and moves a GPU between models", async () => {
    const inst = await stoppedInstance("l40s", "gpu");
    await expectCode(t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "small" }), "INVALID_INPUT");
    const resized = (await t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "a100" })).resizeInstance;
    expect(resized.gpus).toEqual([{ model: "nvidia-a100", count: 1 }]);
    const held = await h.platform.db.prisma.nodeGpu.findMany({ where: { allocationId: resized.allocationId } });
    expect(held.map((g) => g.model)).toEqual(["nvidia-a100"]);
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await confirmDeleted(h.platform, inst.id);
    expect(await invariantViolations(h.platform)).toEqual([]);
  });
});

describe("provider pools, without a worker", () => {
  it("refuse creates until the provider's offers are known, charging nothing; refuse GPU flavors and resize", async () => {
    const { createProviderAccount } = await h.operator.request(CreateProviderAccountDocument, {
      input: { name: "hz", provider: "hetzner-cloud", config: {}, credentials: { token: "env:HCLOUD_TOKEN" } },
    });
    const { createPool } = await h.operator.request(CreatePoolDocument, {
      input: { name: "hz-fsn1", class: "PROVIDER", providerAccountId: createProviderAccount.id },
    });
    await h.operator.request(CreateFlavorDocument, { input: { poolId: createPool.id, name: "cx22", vcpus: 2, memoryMib: 4096, diskGib: 40 } });
    await expectCode(
      h.operator.request(CreateFlavorDocument, {
        input: { poolId: createPool.id, name: "g1", vcpus: 2, memoryMib: 4096, diskGib: 40, gpus: [{ model: "nvidia-l40s", count: 1 }] },
      }),
      "INVALID_INPUT",
    );
    const pt = await h.tenant();
    const before = await ledger(h.platform);
    const refused = await expectCode(create(pt, { poolId: createPool.id, flavor: "cx22", imageId: "debian-12" }), "UNSCHEDULABLE");
    expect(refused.message).toContain("not known yet");
    expect(await ledger(h.platform)).toEqual(before);
    await expectCode(h.operator.request(ProviderOffersDocument, { poolId: (await h.hostedPool()).poolId }), "INVALID_INPUT");
    expect((await h.operator.request(ProviderOffersDocument, { poolId: createPool.id })).providerOffers).toEqual([]);
  });
});

describe("quota balance", () => {
  it("holds after random create / stop / start / delete sequences, and returns to zero", async () => {
    const t = await h.tenant({ quota: { instances: 6, vcpus: 12 } });
    const pool = await h.hostedPool({
      ipv4Range: "10.9.0.0/28",
      nodes: [
        { vcpus: 8, memoryMib: 16384, diskGib: 300 },
        { vcpus: 6, memoryMib: 16384, diskGib: 300 },
      ],
      flavors: [
        { name: "small", vcpus: 2, memoryMib: 2048, diskGib: 20 },
        { name: "medium", vcpus: 4, memoryMib: 4096, diskGib: 40 },
      ],
    });
    const op = fc.oneof(
      fc.record({ kind: fc.constant("create" as const), flavor: fc.constantFrom("small", "medium") }),
      fc.record({ kind: fc.constantFrom("stop" as const, "start" as const, "delete" as const), pick: fc.nat() }),
    );
    let key = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 5, maxLength: 25 }), async (ops) => {
        const live: string[] = [];
        for (const o of ops) {
          if (o.kind === "create") {
            try {
              live.push((await create(t, { poolId: pool.poolId, flavor: o.flavor, imageId: pool.imageId, idempotencyKey: `k${key++}` })).id);
            } catch (e) {
              expect(["QUOTA_EXCEEDED", "UNSCHEDULABLE"]).toContain((e as { code: string }).code);
            }
            continue;
          }
          if (!live.length) continue;
          const id = live[o.pick % live.length] as string;
          if (o.kind === "delete") {
            await t.client.request(DeleteInstanceDocument, { id });
            await confirmDeleted(h.platform, id);
            live.splice(live.indexOf(id), 1);
          } else if (o.kind === "stop") await t.client.request(StopInstanceDocument, { id });
          else await t.client.request(StartInstanceDocument, { id });
          expect(await invariantViolations(h.platform)).toEqual([]);
        }
        for (const id of live) {
          await t.client.request(DeleteInstanceDocument, { id });
          await confirmDeleted(h.platform, id);
        }
        const usage = await h.platform.db.prisma.quotaUsage.findMany({ where: { tenantId: t.id } });
        expect(usage.every((u) => u.used === 0n)).toBe(true);
        expect(await h.platform.db.prisma.ipAddress.count({ where: { ipPool: { poolId: pool.poolId }, instanceId: { not: null } } })).toBe(0);
        expect(await invariantViolations(h.platform)).toEqual([]);
      }),
      { numRuns: 8, seed: 4242 },
    );
  });
});
