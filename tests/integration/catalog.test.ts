import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CreateFlavorDocument,
  CreateInstanceDocument,
  CreateNodeDocument,
  CreatePoolDocument,
  CreateProviderAccountDocument,
  CreateTenantDocument,
  DeleteFlavorDocument,
  DeleteProviderAccountDocument,
  FlavorsDocument,
  InstanceDocument,
  PoolDocument,
  PoolsDocument,
  PoolWithNodesDocument,
  ProviderAccountsDocument,
  RegisterImageDocument,
  SetNodeCapacityDocument,
  SetNodeStateDocument,
  SetTenantQuotaDocument,
  TenantDocument,
  UpdateFlavorDocument,
} from "../../sdk/client.ts";
import { sha256Of } from "../support/fixtures.ts";
import { expectCode, type Harness, startHarness } from "../support/harness.ts";

let h: Harness;
beforeAll(async () => {
  h = await startHarness({ PROVIDERS: "hetzner-cloud,proxmox-ve" });
});
afterAll(() => h?.close());

let ranges = 0;
/** A hosted pool with a range of its own (ranges may not overlap) unless the test names one. */
const hosted = (name: string, extra: Record<string, unknown> = {}) =>
  h.operator.request(CreatePoolDocument, { input: { name, class: "VPS_HOST", ipv4Range: `198.18.${ranges++}.0/24`, ...extra } as never });

describe("pools", () => {
  it("creates a hosted pool with its IPv4 range and reports IPAM", async () => {
    const { createPool } = await hosted("fra1", { ipv4Range: "192.0.2.0/24", ipv4Gateway: "192.0.2.254" });
    expect(createPool).toMatchObject({ class: "VPS_HOST", agent: "bcd", runtime: "libvirt-kvm", ipam: { range: "192.0.2.0/24", total: 253, used: 0 } });
    expect((await h.operator.request(PoolsDocument)).pools.map((p) => p.name)).toContain("fra1");
  });

  it("refuses mismatched or malformed pools with INVALID_INPUT, a taken name with CONFLICT", async () => {
    await expectCode(h.operator.request(CreatePoolDocument, { input: { name: "no-range", class: "VPS_HOST" } }), "INVALID_INPUT");
    await expectCode(hosted("bad-range", { ipv4Range: "192.0.2.1/24" }), "INVALID_INPUT");
    await expectCode(hosted("too-big", { ipv4Range: "10.0.0.0/8" }), "INVALID_INPUT");
    await expectCode(hosted("bad-gw", { ipv4Gateway: "192.0.3.1" }), "INVALID_INPUT");
    await expectCode(hosted("Bad Name"), "INVALID_INPUT");
    await expectCode(hosted("with-account", { providerAccountId: "pacc_x" }), "INVALID_INPUT");
    await expectCode(h.operator.request(CreatePoolDocument, { input: { name: "prov", class: "PROVIDER" } }), "INVALID_INPUT");
    await expectCode(h.operator.request(CreatePoolDocument, { input: { name: "prov", class: "PROVIDER", providerAccountId: "pacc_missing" } }), "NOT_FOUND");
    await expectCode(h.operator.request(CreatePoolDocument, { input: { name: "cont", class: "CONTAINER" as never } }), "INVALID_INPUT");
    await hosted("dup");
    await expectCode(hosted("dup"), "CONFLICT");
    expect(
      await h.platform.db.prisma.pool.count({ where: { name: { in: ["no-range", "bad-range", "too-big", "bad-gw", "with-account", "prov", "cont"] } } }),
    ).toBe(0);
  });
});

describe("nodes", () => {
  it("records capacity with GPUs and refuses to shrink below what is allocated", async () => {
    const { createPool } = await hosted("nodes-pool");
    const { createNode } = await h.operator.request(CreateNodeDocument, {
      input: {
        poolId: createPool.id,
        name: "gpu-1",
        capacity: { vcpus: 32, memoryMib: 131072, diskGib: 2000, gpus: [{ model: "nvidia-l40s", count: 2, pciAddresses: ["0000:41:00.0", "0000:42:00.0"] }] },
      },
    });
    expect(createNode).toMatchObject({
      state: "READY",
      capacity: { vcpus: 32, gpus: [{ model: "nvidia-l40s", count: 2 }] },
      allocated: { vcpus: 0, gpus: [] },
    });
    await expectCode(
      h.operator.request(CreateNodeDocument, { input: { poolId: createPool.id, name: "gpu-1", capacity: { vcpus: 1, memoryMib: 1024, diskGib: 1 } } }),
      "CONFLICT",
    );
    await expectCode(
      h.operator.request(CreateNodeDocument, { input: { poolId: createPool.id, name: "neg", capacity: { vcpus: -1, memoryMib: 1024, diskGib: 1 } } }),
      "INVALID_INPUT",
    );
    await h.operator.request(CreateFlavorDocument, {
      input: { poolId: createPool.id, name: "g", vcpus: 16, memoryMib: 65536, diskGib: 500, gpus: [{ model: "nvidia-l40s", count: 1 }] },
    });
    const { registerImage } = await h.operator.request(RegisterImageDocument, {
      input: { name: "img", source: "https://x.invalid/i.qcow2", sha256: sha256Of("e"), format: "QCOW2", public: true },
    });
    const t = await h.tenant();
    await t.client.request(CreateInstanceDocument, { input: { poolId: createPool.id, flavor: "g", imageId: registerImage.id } });
    await expectCode(
      h.operator.request(SetNodeCapacityDocument, { id: createNode.id, capacity: { vcpus: 8, memoryMib: 131072, diskGib: 2000 } }),
      "PRECONDITION_FAILED",
    );
    await expectCode(
      h.operator.request(SetNodeCapacityDocument, { id: createNode.id, capacity: { vcpus: 32, memoryMib: 131072, diskGib: 2000, gpus: [] } }),
      "PRECONDITION_FAILED",
    );
    const grown = await h.operator.request(SetNodeCapacityDocument, {
      id: createNode.id,
      capacity: { vcpus: 48, memoryMib: 131072, diskGib: 2000, gpus: [{ model: "nvidia-l40s", count: 1 }] },
    });
    expect(grown.setNodeCapacity).toMatchObject({
      capacity: { vcpus: 48, gpus: [{ model: "nvidia-l40s", count: 1 }] },
      allocated: { vcpus: 16, gpus: [{ model: "nvidia-l40s", count: 1 }] },
    });
    // A cordoned node keeps its instances and takes no new ones.
    await h.operator.request(SetNodeStateDocument, { id: createNode.id, state: "CORDONED" });
    await h.operator.request(CreateFlavorDocument, { input: { poolId: createPool.id, name: "c", vcpus: 1, memoryMib: 1024, diskGib: 1 } });
    await expectCode(t.client.request(CreateInstanceDocument, { input: { poolId: createPool.id, flavor: "c", imageId: registerImage.id } }), "UNSCHEDULABLE");
    await expectCode(h.operator.request(SetNodeStateDocument, { id: createNode.id, state: "LOST" }), "FORBIDDEN");
    const pool = (await h.operator.request(PoolWithNodesDocument, { id: createPool.id })).pool;
    expect(pool?.nodes.map((n) => [n.name, n.state, n.instances])).toEqual([["gpu-1", "CORDONED", 1]]);
    expect(pool?.ipam?.used).toBe(1);
  });
});

describe("flavors", () => {
  it("validates shapes, keeps names unique per pool, and never changes admitted instances", async () => {
    const { createPool } = await hosted("flavor-pool");
    const { createPool: other } = await hosted("flavor-pool-2");
    const input = { poolId: createPool.id, name: "m1", vcpus: 2, memoryMib: 4096, diskGib: 40 };
    const { createFlavor } = await h.operator.request(CreateFlavorDocument, { input });
    await expectCode(h.operator.request(CreateFlavorDocument, { input }), "CONFLICT");
    await h.operator.request(CreateFlavorDocument, { input: { ...input, poolId: other.id } });
    for (const bad of [
      { vcpus: 0 },
      { memoryMib: 64 },
      { diskGib: 0 },
      { name: "Has Space" },
      { gpus: [{ model: "x", count: 0 }] },
      {
        gpus: [
          { model: "a", count: 1 },
          { model: "a", count: 1 },
        ],
      },
    ]) {
      await expectCode(h.operator.request(CreateFlavorDocument, { input: { ...input, name: "bad", ...bad } }), "INVALID_INPUT");
    }
    await expectCode(h.operator.request(CreateFlavorDocument, { input: { ...input, poolId: "pool_nope", name: "x" } }), "NOT_FOUND");
    const t = await h.tenant();
    await expectCode(t.client.request(CreateFlavorDocument, { input: { ...input, name: "mine" } }), "FORBIDDEN");
    expect((await t.client.request(FlavorsDocument, { poolId: createPool.id })).flavors.map((f) => f.name)).toEqual(["m1"]);

    await h.operator.request(CreateNodeDocument, { input: { poolId: createPool.id, name: "n1", capacity: { vcpus: 16, memoryMib: 65536, diskGib: 1000 } } });
    const { registerImage } = await h.operator.request(RegisterImageDocument, {
      input: { name: "i", source: "https://x.invalid/i.qcow2", sha256: sha256Of("f"), format: "QCOW2", public: true },
    });
    const inst = (await t.client.request(CreateInstanceDocument, { input: { poolId: createPool.id, flavor: "m1", imageId: registerImage.id } })).createInstance;
    const updated = await h.operator.request(UpdateFlavorDocument, { id: createFlavor.id, input: { vcpus: 4 } });
    expect(updated.updateFlavor).toMatchObject({ vcpus: 4, memoryMib: 4096 });
    await expectCode(h.operator.request(UpdateFlavorDocument, { id: createFlavor.id, input: { memoryMib: 1 } }), "INVALID_INPUT");
    await h.operator.request(DeleteFlavorDocument, { id: createFlavor.id });
    expect((await t.client.request(InstanceDocument, { id: inst.id })).instance).toMatchObject({ flavor: "m1", vcpus: 2 });
  });
});

describe("provider accounts", () => {
  it("accepts configured providers with a valid config, refuses the rest, and guards deletion", async () => {
    await expectCode(h.operator.request(CreateProviderAccountDocument, { input: { name: "x", provider: "nimbus", config: {} } }), "INVALID_INPUT");
    // A secret inline in the config is refused (the schema is strict), and the refusal does not repeat it.
    const inline = await expectCode(
      h.operator.request(CreateProviderAccountDocument, { input: { name: "x", provider: "hetzner-cloud", config: { token: "inline-secret" } } }),
      "INVALID_INPUT",
    );
    expect(inline.message).not.toContain("inline-secret");
    const missing = await expectCode(
      h.operator.request(CreateProviderAccountDocument, { input: { name: "x", provider: "hetzner-cloud", config: {} } }),
      "INVALID_INPUT",
    );
    expect(missing.message).toContain("input.credentials.token");
    const bare = await expectCode(
      h.operator.request(CreateProviderAccountDocument, {
        input: { name: "x", provider: "hetzner-cloud", config: {}, credentials: { token: "bare-secret-value" } },
      }),
      "INVALID_INPUT",
    );
    expect(bare.message).not.toContain("bare-secret-value");
    await expectCode(
      h.operator.request(CreateProviderAccountDocument, {
        input: { name: "x", provider: "hetzner-cloud", config: {}, credentials: { token: "env:T", password: "env:P" } },
      }),
      "INVALID_INPUT",
    );
    await expectCode(
      h.operator.request(CreateProviderAccountDocument, {
        input: {
          name: "x",
          provider: "proxmox-ve",
          config: { endpoint: "not a url", tokenId: "a@pam!b", node: "pve", templates: { d: 9000 } },
          credentials: { tokenSecret: "env:X" },
        },
      }),
      "INVALID_INPUT",
    );
    const { createProviderAccount } = await h.operator.request(CreateProviderAccountDocument, {
      input: {
        name: "pve",
        provider: "proxmox-ve",
        config: { endpoint: "https://pve.invalid:8006/api2/json", tokenId: "root@pam!bc", node: "pve", templates: { "debian-12": 9000 } },
        credentials: { tokenSecret: { value: "a-sealed-secret" } },
      },
    });
    expect(createProviderAccount.credentials).toEqual({ tokenSecret: "sealed" });
    expect(JSON.stringify(createProviderAccount)).not.toContain("a-sealed-secret");
    const { createProviderAccount: byEnv } = await h.operator.request(CreateProviderAccountDocument, {
      input: { name: "hz-env", provider: "hetzner-cloud", config: {}, credentials: { token: "env:HCLOUD_TOKEN" } },
    });
    expect(byEnv.credentials).toEqual({ token: "env:HCLOUD_TOKEN" });
    await expectCode(
      h.operator.request(CreateProviderAccountDocument, { input: { name: "pve", provider: "hetzner-cloud", config: {}, credentials: { token: "env:T" } } }),
      "CONFLICT",
    );
    const { createPool } = await h.operator.request(CreatePoolDocument, {
      input: { name: "pve-pool", class: "PROVIDER", providerAccountId: createProviderAccount.id },
    });
    expect(createPool).toMatchObject({ class: "PROVIDER", agent: "none", ipam: null, runtime: null });
    await expectCode(
      h.operator.request(CreatePoolDocument, {
        input: { name: "pve-2", class: "PROVIDER", providerAccountId: createProviderAccount.id, ipv4Range: "10.0.0.0/24" },
      }),
      "INVALID_INPUT",
    );
    await expectCode(h.operator.request(DeleteProviderAccountDocument, { id: createProviderAccount.id }), "PRECONDITION_FAILED");
    expect((await h.operator.request(ProviderAccountsDocument)).providerAccounts.map((a) => a.name)).toContain("pve");
    const t = await h.tenant();
    await expectCode(t.client.request(ProviderAccountsDocument), "FORBIDDEN");
    expect((await t.client.request(PoolDocument, { id: createPool.id })).pool?.name).toBe("pve-pool");
  });
});

describe("tenants and quota", () => {
  it("reports limits and usage, and validates quota input", async () => {
    const { createTenant } = await h.operator.request(CreateTenantDocument, {
      input: { name: "quota-co", quota: { vcpus: 8, gpus: [{ model: "nvidia-l40s", count: 2 }] } },
    });
    // The four scalar resources are always listed (null: unlimited); GPU models once limited or used.
    expect(createTenant.quota).toEqual([
      { resource: "disk_gib", limit: null, used: 0 },
      { resource: "gpu:nvidia-l40s", limit: 2, used: 0 },
      { resource: "instances", limit: null, used: 0 },
      { resource: "memory_mib", limit: null, used: 0 },
      { resource: "vcpus", limit: 8, used: 0 },
    ]);
    await expectCode(h.operator.request(CreateTenantDocument, { input: { name: "quota-co" } }), "CONFLICT");
    await expectCode(h.operator.request(CreateTenantDocument, { input: { name: "neg", quota: { vcpus: -1 } } }), "INVALID_INPUT");
    const { setTenantQuota } = await h.operator.request(SetTenantQuotaDocument, { tenantId: createTenant.id, quota: { instances: 1 } });
    expect(setTenantQuota.quota.filter((q) => q.limit !== null)).toEqual([{ resource: "instances", limit: 1, used: 0 }]);
    expect((await h.operator.request(TenantDocument, { id: createTenant.id })).tenant?.name).toBe("quota-co");
  });
});

describe("image sources", () => {
  const register = (client: Harness["operator"], source: string, name = "src") =>
    client.request(RegisterImageDocument, { input: { name, source, sha256: sha256Of("9"), format: "QCOW2" } });

  it("takes https only: plain http (the metadata endpoint, loopback), file and other schemes are INVALID_INPUT naming the field", async () => {
    const t = await h.tenant();
    for (const source of ["http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:8080/i.qcow2", "file:///etc/shadow", "ftp://mirror.invalid/i.qcow2"]) {
      for (const client of [t.client, h.operator]) {
        const err = await expectCode(register(client, source, "refused-src"), "INVALID_INPUT");
        expect(err.message).toBe("INVALID_INPUT: input.source: expected an https URL");
      }
    }
    expect(await h.platform.db.prisma.image.count({ where: { name: "refused-src" } })).toBe(0);
    expect((await register(t.client, "https://mirror.invalid/i.qcow2")).registerImage.source).toBe("https://mirror.invalid/i.qcow2");
  });

  it("takes plain http where the deployment allows it (IMAGE_SOURCE_HTTP), and still no other scheme", async () => {
    const lenient = await startHarness({ IMAGE_SOURCE_HTTP: "true" });
    try {
      const t = await lenient.tenant();
      expect((await register(t.client, "http://mirror.lan/i.qcow2")).registerImage.source).toBe("http://mirror.lan/i.qcow2");
      const err = await expectCode(register(t.client, "file:///etc/shadow"), "INVALID_INPUT");
      expect(err.message).toBe("INVALID_INPUT: input.source: expected an http(s) URL");
    } finally {
      await lenient.close();
    }
  });
});
