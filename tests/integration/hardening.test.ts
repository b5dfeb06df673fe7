import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CreateInstanceDocument,
  CreateJoinTokenDocument,
  CreateNodeDocument,
  CreateProjectDocument,
  JoinNodeDocument,
  ProjectsDocument,
  ReportStatusDocument,
  SetNodeCapacityDocument,
} from "../../sdk/client.ts";
import { expectCode, type Harness, startHarness } from "../support/harness.ts";

/** Careless and hostile input that once got through: each is refused at the boundary and writes nothing. */

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(() => h?.close());

describe("GPU inventory", () => {
  const node = (poolId: string, name: string, gpus: unknown) =>
    h.operator.request(CreateNodeDocument, { input: { poolId, name, capacity: { vcpus: 8, memoryMib: 8192, diskGib: 100, gpus: gpus as never } } });

  it("refuses duplicate PCI addresses, a count the addresses do not match, and a model listed twice", async () => {
    const pool = await h.hostedPool({ nodes: [] });
    const nodes = () => h.platform.db.prisma.node.count({ where: { poolId: pool.poolId } });
    const refused = [
      [{ model: "nvidia-a100", count: 2, pciAddresses: ["0000:3b:00.0", "0000:3b:00.0"] }],
      [{ model: "nvidia-a100", count: 2, pciAddresses: ["0000:3b:00.0"] }],
      [
        { model: "nvidia-a100", count: 1, pciAddresses: ["0000:3b:00.0"] },
        { model: "nvidia-l4", count: 1, pciAddresses: ["0000:3b:00.0"] },
      ],
      [
        { model: "nvidia-a100", count: 1 },
        { model: "nvidia-a100", count: 1 },
      ],
    ];
    for (const [i, gpus] of refused.entries()) {
      const err = await expectCode(node(pool.poolId, `bad-${i}`, gpus), "INVALID_INPUT");
      expect(err.message).toMatch(/PCI address|need 2 PCI addresses|listed twice/);
    }
    expect(await nodes()).toBe(0);
    const { createNode } = await node(pool.poolId, "good", [{ model: "nvidia-a100", count: 2, pciAddresses: ["0000:3b:00.0", "0000:5e:00.0"] }]);
    expect(createNode.capacity.gpus).toEqual([{ model: "nvidia-a100", count: 2 }]);
    await expectCode(
      h.operator.request(SetNodeCapacityDocument, {
        id: createNode.id,
        capacity: { vcpus: 8, memoryMib: 8192, diskGib: 100, gpus: [{ model: "nvidia-a100", count: 3, pciAddresses: ["0000:3b:00.0", "0000:5e:00.0"] }] },
      }),
      "INVALID_INPUT",
    );
    expect(await h.platform.db.prisma.nodeGpu.count({ where: { nodeId: createNode.id } })).toBe(2);
  });

  it("refuses a host report that names one PCI address twice", async () => {
    const pool = await h.hostedPool({ nodes: [] });
    const { createJoinToken } = await h.operator.request(CreateJoinTokenDocument, { poolId: pool.poolId });
    const { joinNode } = await h.client().request(JoinNodeDocument, { token: createJoinToken.token, name: "gpu-host" });
    const host = h.client(joinNode.credential);
    const gpu = { model: "nvidia-l4", pciAddress: "0000:65:00.0" };
    const report = (gpus: unknown[]) =>
      host.request(ReportStatusDocument, { report: { generation: 0, instances: [], capacity: { vcpus: 8, memoryMib: 8192, diskGib: 100, gpus } } });
    await expectCode(report([gpu, gpu]), "INVALID_INPUT");
    expect(await h.platform.db.prisma.nodeGpu.count({ where: { nodeId: joinNode.nodeId } })).toBe(0);
    await report([gpu, { ...gpu, pciAddress: "0000:66:00.0" }]);
    expect(await h.platform.db.prisma.nodeGpu.count({ where: { nodeId: joinNode.nodeId } })).toBe(2);
  });
});

describe("projects", () => {
  it("asks an operator to name the tenant, and answers a tenant naming another as not found", async () => {
    const a = await h.tenant();
    const b = await h.tenant();
    const projects = () => h.platform.db.prisma.project.count();
    const before = await projects();
    const err = await expectCode(h.operator.request(CreateProjectDocument, { name: "orphan" }), "INVALID_INPUT");
    expect(err.message).toMatch(/tenantId/);
    await expectCode(a.client.request(CreateProjectDocument, { name: "sneaky", tenantId: b.id }), "NOT_FOUND");
    await expectCode(a.client.request(ProjectsDocument, { tenantId: b.id }), "NOT_FOUND");
    expect(await projects()).toBe(before);
    const { createProject } = await a.client.request(CreateProjectDocument, { name: "mine", tenantId: a.id });
    expect(createProject.tenantId).toBe(a.id);
    expect((await a.client.request(ProjectsDocument, { tenantId: a.id })).projects.map((p) => p.name)).toEqual(["mine"]);
  });
});

describe("idempotency hash", () => {
  it("is keyed: reading the database confirms no guess of the sealed user data", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const userData = "#cloud-config\npassword: correct-horse";
    const input = { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, userData, idempotencyKey: "guess-me" };
    const { createInstance } = await t.client.request(CreateInstanceDocument, { input });
    const row = await h.platform.db.prisma.instance.findUniqueOrThrow({ where: { id: createInstance.id } });
    const guess = createHash("sha256")
      .update(JSON.stringify([pool.poolId, "small", pool.imageId, [], userData, null, "running"]))
      .digest("hex");
    expect(row.requestHash).toMatch(/^[0-9a-f]{64}$/);
    expect(row.requestHash).not.toBe(guess);
    // Replays still match, and other inputs under the key are still a conflict.
    expect((await t.client.request(CreateInstanceDocument, { input })).createInstance.id).toBe(createInstance.id);
    await expectCode(t.client.request(CreateInstanceDocument, { input: { ...input, userData: "#cloud-config\n" } }), "CONFLICT");
  });
});
