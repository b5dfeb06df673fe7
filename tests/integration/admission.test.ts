import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { instanceId } from "../../core/kernel/ids.ts";
import { admitInstance } from "../../core/lifecycle/admission.ts";
import {
  CreateInstanceDocument,
  CreatePoolDocument,
  CreateProjectDocument,
  DeleteFlavorDocument,
  FlavorsDocument,
  InstanceDocument,
  type InstanceFieldsFragment,
  RegisterImageDocument,
  StopInstanceDocument,
  UpdateFlavorDocument,
} from "../../sdk/client.ts";
import { sha256Of, testKey } from "../support/fixtures.ts";
import { expectCode, type Harness, startHarness } from "../support/harness.ts";
import { invariantViolations, ledger } from "../support/ledger.ts";

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(() => h?.close());

const create = (c: Harness["operator"], input: Record<string, unknown>) =>
  c.request(CreateInstanceDocument, { input: input as never }).then((r) => r.createInstance as InstanceFieldsFragment);

/** The call must fail with `code` and leave every counted row as it was. */
async function refusedWithoutTrace(call: () => Promise<unknown>, code: string) {
  const before = await ledger(h.platform);
  const err = await expectCode(call(), code);
  expect(await ledger(h.platform)).toEqual(before);
  return err;
}

describe("createInstance on a hosted pool", () => {
  it("places, leases, charges and records in one go", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool({ ipv4Range: "10.1.0.0/24" });
    const inst = await create(t.client, {
      poolId: pool.poolId,
      flavor: "small",
      imageId: pool.imageId,
      sshKeys: [testKey()],
      userData: "#cloud-config\n",
      idempotencyKey: "first",
    });
    // Placed at admission, so scheduled and on its host's spec in the same write.
    expect(inst).toMatchObject({
      state: "PROVISIONING",
      desiredState: "RUNNING",
      version: 3,
      flavor: "small",
      vcpus: 2,
      imageVerified: true,
      runtime: "libvirt-kvm",
    });
    expect(inst.id).toMatch(/^inst_[a-z2-7]{52}$/);
    expect(inst.nodeId).toBe(pool.nodeIds[0]);
    expect(inst.allocationId).toMatch(/^alloc_/);
    expect(inst.addresses).toEqual(["10.1.0.2"]); // .0 network, .1 gateway
    expect(inst.userData).toBe("#cloud-config\n");
    const events = await h.platform.db.prisma.instanceEvent.findMany({ where: { instanceId: inst.id } });
    expect(events.toSorted((a, b) => a.version - b.version)).toMatchObject([
      { fromState: null, toState: "pending", version: 1, actor: t.identityId, reason: "created" },
      { fromState: "pending", toState: "scheduling", version: 2, actor: "admission", reason: "schedule" },
      { fromState: "scheduling", toState: "provisioning", version: 3, actor: "admission", reason: "placed" },
    ]);
    expect(await h.platform.db.prisma.auditLog.count({ where: { targetId: inst.id, action: "createInstance" } })).toBe(1);
    const usage = await h.platform.db.prisma.quotaUsage.findMany({ where: { tenantId: t.id }, orderBy: { resource: "asc" } });
    expect(usage.map((u) => [u.resource, Number(u.used)])).toEqual([
      ["disk_gib", 20],
      ["instances", 1],
      ["memory_mib", 2048],
      ["vcpus", 2],
    ]);
    const row = await h.platform.db.prisma.instance.findUniqueOrThrow({ where: { id: inst.id } });
    expect(Buffer.from(row.userDataSealed as Uint8Array).toString()).not.toContain("cloud-config");
    expect(await invariantViolations(h.platform)).toEqual([]);
  });

  it("is idempotent: a replay returns the instance, other inputs under the same key are a CONFLICT", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const input = { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, idempotencyKey: "same" };
    const a = await create(t.client, input);
    const b = await create(t.client, input);
    expect(b.id).toBe(a.id);
    expect(b.version).toBe(a.version);
    await refusedWithoutTrace(() => create(t.client, { ...input, sshKeys: [testKey()] }), "CONFLICT");
    // The same key from another tenant is another instance.
    const other = await h.tenant();
    expect((await create(other.client, input)).id).not.toBe(a.id);
  });

  it("turns 50 concurrent identical creates into exactly one instance", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const input = { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, idempotencyKey: "burst" };
    const results = await Promise.all(Array.from({ length: 50 }, () => create(t.client, input)));
    expect(new Set(results.map((r) => r.id)).size).toBe(1);
    expect(await h.platform.db.prisma.instance.count({ where: { tenantId: t.id } })).toBe(1);
    expect(await h.platform.db.prisma.allocation.count({ where: { tenantId: t.id } })).toBe(1);
    expect(await invariantViolations(h.platform)).toEqual([]);
  });

  it("never over-commits: 20 creates racing for a node with room for 7 give exactly 7", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool({ nodes: [{ vcpus: 14, memoryMib: 65536, diskGib: 1000 }] });
    const settled = await Promise.allSettled(
      Array.from({ length: 20 }, (_, i) => create(t.client, { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, idempotencyKey: `race-${i}` })),
    );
    const ok = settled.filter((s) => s.status === "fulfilled");
    const codes = settled.flatMap((s) => (s.status === "rejected" ? [(s.reason as { code: string }).code] : []));
    expect(ok.length).toBe(7);
    expect(codes).toEqual(Array(13).fill("UNSCHEDULABLE"));
    const node = await h.platform.db.prisma.node.findUniqueOrThrow({ where: { id: pool.nodeIds[0] } });
    expect(node.allocVcpus).toBe(14);
    expect(await invariantViolations(h.platform)).toEqual([]);
  });

  it("gives the last address to exactly one of two racing creates", async () => {
    const t = await h.tenant();
    // A /30 has one leasable address: .0 network, .1 gateway, .2 lease, .3 broadcast.
    const pool = await h.hostedPool({ ipv4Range: "10.2.0.0/30" });
    const settled = await Promise.allSettled(
      [0, 1].map((i) => create(t.client, { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, idempotencyKey: `ip-${i}` })),
    );
    const ok = settled.filter((s): s is PromiseFulfilledResult<InstanceFieldsFragment> => s.status === "fulfilled");
    expect(ok.map((s) => s.value.addresses)).toEqual([["10.2.0.2"]]);
    const failed = settled.find((s) => s.status === "rejected") as PromiseRejectedResult;
    expect(failed.reason.code).toBe("UNSCHEDULABLE");
    expect(failed.reason.message).toMatch(/no free IPv4 address/);
    expect(await invariantViolations(h.platform)).toEqual([]);
  });

  it("refuses a hosted pool whose range overlaps another's, also when two are made at once", async () => {
    await h.hostedPool({ ipv4Range: "10.3.0.0/24" });
    const createPool = (name: string, ipv4Range: string) =>
      h.operator.request(CreatePoolDocument, { input: { name, class: "VPS_HOST", ipv4Range } }).then((r) => r.createPool.id);
    const pools = () => h.platform.db.prisma.pool.count();
    const before = await pools();
    for (const [name, range] of [
      ["inside", "10.3.0.128/25"],
      ["around", "10.3.0.0/16"],
      ["same", "10.3.0.0/24"],
    ] as const) {
      const err = await expectCode(createPool(name, range), "CONFLICT");
      expect(err.message).toMatch(/overlaps 10\.3\.0\.0\/24/);
    }
    expect(await pools()).toBe(before);
    expect(await h.platform.db.prisma.auditLog.count({ where: { action: "createPool", details: { path: ["ipv4Range"], equals: "10.3.0.0/16" } } })).toBe(0);
    await createPool("beside", "10.3.1.0/24");
    const raced = await Promise.allSettled([createPool("race-a", "10.4.0.0/24"), createPool("race-b", "10.4.0.0/25")]);
    expect(raced.map((r) => r.status).sort()).toEqual(["fulfilled", "rejected"]);
    expect((raced.find((r) => r.status === "rejected") as PromiseRejectedResult).reason.code).toBe("CONFLICT");
  });

  it("places whole GPUs of the flavor's model and never shares one", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool({
      nodes: [
        { vcpus: 64, memoryMib: 262144, diskGib: 4000, gpus: [{ model: "nvidia-l40s", count: 2 }] },
        { vcpus: 64, memoryMib: 262144, diskGib: 4000 },
      ],
      flavors: [
        { name: "gpu1", vcpus: 8, memoryMib: 32768, diskGib: 100, gpus: [{ model: "nvidia-l40s", count: 1 }] },
        { name: "a100", vcpus: 8, memoryMib: 32768, diskGib: 100, gpus: [{ model: "nvidia-a100", count: 1 }] },
        { name: "small", vcpus: 2, memoryMib: 2048, diskGib: 20 },
      ],
    });
    // A CPU-only instance goes to the node without GPUs, keeping the GPU host for GPU work.
    const cpu = await create(t.client, { poolId: pool.poolId, flavor: "small", imageId: pool.imageId });
    expect(cpu.nodeId).toBe(pool.nodeIds[1]);
    const settled = await Promise.allSettled(
      [0, 1, 2].map((i) => create(t.client, { poolId: pool.poolId, flavor: "gpu1", imageId: pool.imageId, idempotencyKey: `g${i}` })),
    );
    const placed = settled.filter((s): s is PromiseFulfilledResult<InstanceFieldsFragment> => s.status === "fulfilled").map((s) => s.value);
    expect(placed.map((p) => p.nodeId)).toEqual([pool.nodeIds[0], pool.nodeIds[0]]);
    expect(settled.filter((s) => s.status === "rejected").map((s) => (s as PromiseRejectedResult).reason.code)).toEqual(["UNSCHEDULABLE"]);
    const gpus = await h.platform.db.prisma.nodeGpu.findMany({ where: { nodeId: pool.nodeIds[0] } });
    expect(new Set(gpus.map((g) => g.allocationId)).size).toBe(2);
    const err = await refusedWithoutTrace(() => create(t.client, { poolId: pool.poolId, flavor: "a100", imageId: pool.imageId }), "UNSCHEDULABLE");
    expect(err.message).toMatch(/1× nvidia-a100/);
    expect(await invariantViolations(h.platform)).toEqual([]);
  });

  it("keeps tenants apart on single-tenant pools", async () => {
    const [a, b] = [await h.tenant(), await h.tenant()];
    const pool = await h.hostedPool({
      singleTenant: true,
      nodes: [
        { vcpus: 8, memoryMib: 16384, diskGib: 200 },
        { vcpus: 8, memoryMib: 16384, diskGib: 200 },
      ],
    });
    const ia = await create(a.client, { poolId: pool.poolId, flavor: "small", imageId: pool.imageId });
    const ib = await create(b.client, { poolId: pool.poolId, flavor: "small", imageId: pool.imageId });
    expect(ia.nodeId).not.toBe(ib.nodeId);
    const ia2 = await create(a.client, { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, idempotencyKey: "2" });
    expect(ia2.nodeId).toBe(ia.nodeId);
    const c = await h.tenant();
    const err = await refusedWithoutTrace(() => create(c.client, { poolId: pool.poolId, flavor: "small", imageId: pool.imageId }), "UNSCHEDULABLE");
    expect(err.message).toMatch(/single-tenant/);
  });
});

/** The messages this process sends PostgreSQL while `call` runs that name `needle` (the create's instance id). */
async function messagesNaming(needle: string, call: () => Promise<unknown>): Promise<string[]> {
  const proto = pg.Client.prototype as unknown as { query: (...a: unknown[]) => unknown };
  const query = proto.query;
  const sent: string[] = [];
  proto.query = function (this: unknown, ...a: unknown[]) {
    const text = typeof a[0] === "string" ? a[0] : ((a[0] as { text?: string } | null)?.text ?? "");
    if (text.includes(needle) || (a[0] as { values?: unknown[] } | null)?.values?.includes(needle)) sent.push(text);
    return query.apply(this, a);
  };
  try {
    await call();
  } finally {
    proto.query = query;
  }
  return sent;
}

describe("createInstance from a remembered catalog", () => {
  it("is one message for a create like an earlier one, and admits nothing on a flavor or image that changed since", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool({
      flavors: [
        { name: "small", vcpus: 2, memoryMib: 2048, diskGib: 20 },
        { name: "other", vcpus: 1, memoryMib: 1024, diskGib: 10 },
      ],
    });
    const base = { poolId: pool.poolId, flavor: "small", imageId: pool.imageId };
    const idOf = (key: string) => instanceId(t.id, t.identityId, key);
    // The first create looks its catalog up: two messages, the lookup (with BEGIN) and admission (with COMMIT).
    expect(await messagesNaming(idOf("k1"), () => create(t.client, { ...base, idempotencyKey: "k1" }))).toHaveLength(2);
    const again = await messagesNaming(idOf("k2"), () => create(t.client, { ...base, idempotencyKey: "k2" }));
    expect(again).toHaveLength(1);
    expect(again[0]).toMatch(/BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; EXECUTE bcx_\d+\(.*\); COMMIT$/s);

    // A changed flavor: the remembered shape is refused by the statement, and the create runs on the new one.
    const flavors = (await h.operator.request(FlavorsDocument, { poolId: pool.poolId })).flavors;
    const small = flavors.find((f) => f.name === "small");
    await h.operator.request(UpdateFlavorDocument, { id: small?.id as string, input: { vcpus: 3 } });
    const bigger = await create(t.client, { ...base, idempotencyKey: "k3" });
    expect(bigger.vcpus).toBe(3);
    const usage = await h.platform.db.prisma.quotaUsage.findUniqueOrThrow({ where: { tenantId_resource: { tenantId: t.id, resource: "vcpus" } } });
    expect(Number(usage.used)).toBe(2 + 2 + 3);
    // And is remembered as it now is.
    expect(await messagesNaming(idOf("k4"), () => create(t.client, { ...base, idempotencyKey: "k4" }))).toHaveLength(1);

    // A deleted flavor, and an image withdrawn behind the API's back: refused as NOT_FOUND, leaving nothing.
    await create(t.client, { ...base, flavor: "other", idempotencyKey: "k5" });
    await h.operator.request(DeleteFlavorDocument, { id: flavors.find((f) => f.name === "other")?.id as string });
    await refusedWithoutTrace(() => create(t.client, { ...base, flavor: "other", idempotencyKey: "k6" }), "NOT_FOUND");
    await h.platform.db.prisma.image.update({ where: { id: pool.imageId }, data: { deletedAt: new Date() } });
    await refusedWithoutTrace(() => create(t.client, { ...base, idempotencyKey: "k7" }), "NOT_FOUND");
    expect(await invariantViolations(h.platform)).toEqual([]);
  });

  it("still answers a replay with the instance it made, and a different request under its key with CONFLICT", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const input = { poolId: pool.poolId, flavor: "small", imageId: pool.imageId };
    await create(t.client, { ...input, idempotencyKey: "first" });
    const a = await create(t.client, { ...input, idempotencyKey: "replayed" });
    const before = await ledger(h.platform);
    const b = await create(t.client, { ...input, idempotencyKey: "replayed" });
    expect(b).toEqual(a);
    expect(await ledger(h.platform)).toEqual(before);
    await refusedWithoutTrace(() => create(t.client, { ...input, idempotencyKey: "replayed", desiredState: "STOPPED" }), "CONFLICT");
    expect(await invariantViolations(h.platform)).toEqual([]);
  });
});

describe("a replay placed step by step", () => {
  it("gets its instance from a remembered catalog, even once the pool has no address or GPU left", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool({
      ipv4Range: "10.9.9.0/30",
      nodes: [{ vcpus: 8, memoryMib: 16384, diskGib: 200, gpus: [{ model: "nvidia-l40s", count: 1 }] }],
      flavors: [{ name: "gpu", vcpus: 1, memoryMib: 1024, diskGib: 10, gpus: [{ model: "nvidia-l40s", count: 1 }] }],
    });
    const input = { poolId: pool.poolId, flavor: "gpu", imageId: pool.imageId, idempotencyKey: "once" };
    const first = await create(t.client, input);
    const before = await ledger(h.platform);
    // The same create again: its catalog is remembered now, and GPUs are placed step by step before the charge.
    expect(await create(t.client, input)).toEqual(first);
    expect(await ledger(h.platform)).toEqual(before);
    expect(await invariantViolations(h.platform)).toEqual([]);
  });
});

describe("createInstance refusals change nothing", () => {
  let t: Awaited<ReturnType<Harness["tenant"]>>;
  let pool: Awaited<ReturnType<Harness["hostedPool"]>>;
  beforeAll(async () => {
    t = await h.tenant({ quota: { instances: 3, vcpus: 5, gpus: [{ model: "nvidia-l40s", count: 0 }] } });
    pool = await h.hostedPool({
      nodes: [{ vcpus: 8, memoryMib: 16384, diskGib: 200, gpus: [{ model: "nvidia-l40s", count: 1 }] }],
      flavors: [
        { name: "small", vcpus: 2, memoryMib: 2048, diskGib: 20 },
        { name: "big", vcpus: 4, memoryMib: 4096, diskGib: 40 },
        { name: "huge", vcpus: 64, memoryMib: 1024, diskGib: 10 },
        { name: "gpu", vcpus: 1, memoryMib: 1024, diskGib: 10, gpus: [{ model: "nvidia-l40s", count: 1 }] },
      ],
    });
  });
  const base = () => ({ poolId: pool.poolId, flavor: "small", imageId: pool.imageId });

  it("NOT_FOUND: pool, flavor, project of another tenant, an image the tenant cannot see", async () => {
    await refusedWithoutTrace(() => create(t.client, { ...base(), poolId: "pool_nope" }), "NOT_FOUND");
    await refusedWithoutTrace(() => create(t.client, { ...base(), flavor: "xl" }), "NOT_FOUND");
    await refusedWithoutTrace(() => create(t.client, { ...base(), imageId: "img_nope" }), "NOT_FOUND");
    const other = await h.tenant();
    const { registerImage } = await other.client.request(RegisterImageDocument, {
      input: { name: "mine", source: "https://x.invalid/i.raw", sha256: sha256Of("b"), format: "RAW" },
    });
    await refusedWithoutTrace(() => create(t.client, { ...base(), imageId: registerImage.id }), "NOT_FOUND");
    const { createProject } = await other.client.request(CreateProjectDocument, { name: "theirs" });
    await refusedWithoutTrace(() => create(t.client, { ...base(), projectId: createProject.id }), "NOT_FOUND");
    // The owner can boot its private image, unverified.
    const own = await create(other.client, { ...base(), imageId: registerImage.id, projectId: createProject.id });
    expect(own).toMatchObject({ imageVerified: false, projectId: createProject.id });
  });

  it("INVALID_INPUT: malformed keys, oversized user data, a desired state a create cannot ask for", async () => {
    await refusedWithoutTrace(() => create(t.client, { ...base(), sshKeys: ["ssh-rsa not-a-key"] }), "INVALID_INPUT");
    await refusedWithoutTrace(() => create(t.client, { ...base(), userData: "x".repeat(64 * 1024 + 1) }), "INVALID_INPUT");
    await refusedWithoutTrace(() => create(t.client, { ...base(), desiredState: "DELETED" }), "INVALID_INPUT");
    await refusedWithoutTrace(() => create(t.client, { ...base(), desiredState: "SIDEWAYS" }), "INVALID_INPUT");
    await refusedWithoutTrace(() => create(t.client, { ...base(), idempotencyKey: "has space" }), "INVALID_INPUT");
  });

  it("QUOTA_EXCEEDED names the limit; UNSCHEDULABLE says what does not fit", async () => {
    const a = await create(t.client, { ...base(), idempotencyKey: "q1" });
    const err = await refusedWithoutTrace(() => create(t.client, { ...base(), flavor: "big", idempotencyKey: "q2" }), "QUOTA_EXCEEDED");
    expect(err.message).toMatch(/quota vcpus exceeded: limit 5, in use 2, asked 4/);
    const gpuErr = await refusedWithoutTrace(() => create(t.client, { ...base(), flavor: "gpu" }), "QUOTA_EXCEEDED");
    expect(gpuErr.message).toMatch(/gpu:nvidia-l40s/);
    const fit = await refusedWithoutTrace(() => create(t.client, { ...base(), flavor: "huge" }), "UNSCHEDULABLE");
    expect(fit.message).toMatch(/room for 64 vCPU/);
    await create(t.client, { ...base(), idempotencyKey: "q3" });
    const count = await refusedWithoutTrace(() => create(t.client, { ...base(), flavor: "small", idempotencyKey: "q4", sshKeys: [] }), "QUOTA_EXCEEDED");
    expect(count.message).toMatch(/vcpus|instances/);
    // Stopping does not give quota back: the instance still holds its place.
    await t.client.request(StopInstanceDocument, { id: a.id });
    await refusedWithoutTrace(() => create(t.client, { ...base(), idempotencyKey: "q5" }), "QUOTA_EXCEEDED");
    expect((await t.client.request(InstanceDocument, { id: a.id })).instance?.desiredState).toBe("STOPPED");
  });

  it("inside a larger write (as a sandbox's boot is), a create refused by its quota charge leaves nothing either", async () => {
    // The charge comes after the instance, its events, span and audit row are written: a refusal there must
    // still take all of them back, here through the error that ends the write rather than admission_refused.
    const u = await h.tenant({ quota: { vcpus: 1 } });
    const err = await refusedWithoutTrace(
      () =>
        h.platform.write({ actor: u.identityId, action: "createInstance" }, (w) =>
          admitInstance(w, h.platform.admission, { identityId: u.identityId, tenantId: u.id }, { ...base(), idempotencyKey: "inner" }),
        ),
      "QUOTA_EXCEEDED",
    );
    expect(err.message).toMatch(/quota vcpus exceeded: limit 1, in use 0, asked 2/);
  });

  it("FORBIDDEN without the create scope; UNAUTHENTICATED without a token", async () => {
    const ro = await h.tenant({ scopes: ["compute:instances:read"] });
    await refusedWithoutTrace(() => create(ro.client, base()), "FORBIDDEN");
    await refusedWithoutTrace(() => create(h.client(), base()), "UNAUTHENTICATED");
    await refusedWithoutTrace(() => create(h.operator, base()), "FORBIDDEN");
  });
});
