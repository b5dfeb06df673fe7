import { execFile } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ProviderEmulator } from "../../providers/emulator.ts";
import { startHetznerEmulator } from "../../providers/hetzner-cloud/emulator.ts";
import {
  CreateFlavorDocument,
  CreateInstanceDocument,
  CreateNodeDocument,
  CreatePoolDocument,
  CreateProviderAccountDocument,
  CreateSandboxTemplateDocument,
  DoctorDocument,
  type DoctorQuery,
  PoolAccountingDocument,
} from "../../sdk/client.ts";
import { until } from "../support/fixtures.ts";
import { expectCode } from "../support/harness.ts";
import { type Hosts, startHosts } from "../support/hosts.ts";

/**
 * The doctor and the accounting audit on simulated hosts: each misconfiguration is made (through the API where
 * the API allows it, in the rows where only a fault or an old version could leave it) and its finding appears;
 * planted drift in the books is reported by the doctor and by `Pool.accounting`, and goes once repaired.
 */
let hosts: Hosts;
let emu: ProviderEmulator;

beforeAll(async () => {
  emu = await startHetznerEmulator({ actionMs: 20 });
  hosts = await startHosts(1, { VPS_RUNTIMES: "libvirt-kvm,fake", PROVIDERS: "hetzner-cloud", PROVIDER_SWEEP_MS: "200" });
  await hosts.start(0);
});
afterAll(async () => {
  await hosts?.close();
  await emu?.close();
});

const findings = async () => (await hosts.h.operator.request(DoctorDocument)).doctor;
const about = (all: DoctorQuery["doctor"], id: string, subject: string) => all.filter((f) => f.id === id && f.subject === subject);
const sql = (text: string, params: unknown[] = []) => hosts.h.platform.db.prisma.$executeRawUnsafe(text, ...params);
const pool = async (name: string, ipv4Range: string) =>
  (await hosts.h.operator.request(CreatePoolDocument, { input: { name, class: "VPS_HOST", ipv4Range } })).createPool.id;

describe("the doctor", () => {
  it("is for operators only, and has nothing to say of a healthy platform's books", async () => {
    const t = await hosts.h.tenant();
    await expectCode(t.client.request(DoctorDocument), "FORBIDDEN");
    await expectCode(t.client.request(PoolAccountingDocument, { id: hosts.poolId }), "FORBIDDEN");
    const all = await findings();
    expect(all.filter((f) => f.id.startsWith("vps.accounting."))).toEqual([]);
    expect(about(all, "vps.pools.ipam", hosts.poolId)).toEqual([]);
    expect((await hosts.h.operator.request(PoolAccountingDocument, { id: hosts.poolId })).pool?.accounting).toEqual({ consistent: true, drift: [] });
  });

  it("finds pools without a listed runtime, without a range, nearly full, or shared on a kernel-sharing runtime", async () => {
    const bare = await pool("bare", "10.70.0.0/24");
    const shared = await pool("shared", "10.71.0.0/24");
    const tight = await pool("tight", "10.72.0.0/30");
    await sql(`DELETE FROM ip_pools WHERE pool_id = $1`, [bare]);
    await sql(`UPDATE pools SET runtime = 'cloud-hypervisor' WHERE id = $1`, [bare]);
    await sql(`UPDATE pools SET runtime = 'fake' WHERE id = $1`, [shared]);
    await sql(`UPDATE ip_addresses SET instance_id = 'inst_planted', leased_at = now() WHERE ip_pool_id = (SELECT id FROM ip_pools WHERE pool_id = $1)`, [
      tight,
    ]);
    let all = await findings();
    expect(about(all, "vps.pools.runtime", bare)).toEqual([
      expect.objectContaining({ severity: "ERROR", message: expect.stringContaining("cloud-hypervisor") }),
    ]);
    expect(about(all, "vps.pools.ipam", bare)).toEqual([expect.objectContaining({ severity: "ERROR", message: expect.stringContaining("no IPv4 range") })]);
    expect(about(all, "vps.pools.ipam", tight)).toEqual([expect.objectContaining({ severity: "WARNING", message: expect.stringContaining("100% leased") })]);
    expect(about(all, "vps.pools.single-tenant", shared)).toHaveLength(1);
    expect(about(all, "vps.pools.runtime", shared)).toEqual([]); // listed
    expect(about(all, "vps.pools.single-tenant", hosts.poolId)).toEqual([]); // a VM runtime
    // The planted leases name no live instance: the audit says so too.
    expect(all.filter((f) => f.id === "vps.accounting.lease.unexplained").map((f) => f.subject)).toEqual(["10.72.0.2"]);

    await sql(`UPDATE pools SET policy = '{"singleTenant": true}' WHERE id = $1`, [shared]);
    await sql(`UPDATE ip_addresses SET instance_id = NULL, leased_at = NULL WHERE ip_pool_id = (SELECT id FROM ip_pools WHERE pool_id = $1)`, [tight]);
    all = await findings();
    expect(about(all, "vps.pools.single-tenant", shared)).toEqual([]);
    expect(about(all, "vps.pools.ipam", tight)).toEqual([]);
    expect(all.filter((f) => f.id.startsWith("vps.accounting."))).toEqual([]);
  });

  it("prints its findings with `bc doctor`, most severe first, and exits 1 while any is an error", async () => {
    // The pools above still hold their errors.
    const run = (...args: string[]) =>
      new Promise<{ code: number | null; out: string }>((resolve) => {
        execFile(
          process.execPath,
          ["bin/bc.mjs", "doctor", "--url", hosts.h.url, ...args],
          { env: { ...process.env, BC_TOKEN: hosts.h.operatorToken } },
          (e, out) => resolve({ code: e ? (typeof e.code === "number" ? e.code : 1) : 0, out }),
        );
      });
    const text = await run();
    expect(text.code).toBe(1);
    expect(text.out).toMatch(/^ERROR\s+vps\.pools\.ipam/);
    expect(text.out).toContain("fix: add ");
    const json = await run("--json");
    expect(JSON.parse(json.out)).toEqual(await findings().then((all) => expect.arrayContaining(all)));
  });

  it("finds hosts without capacity, silent and lost", async () => {
    const make = async (name: string) =>
      (await hosts.h.operator.request(CreateNodeDocument, { input: { poolId: hosts.poolId, name, capacity: { vcpus: 0, memoryMib: 0, diskGib: 0 } } }))
        .createNode.id;
    const empty = await make("empty");
    const gone = await make("gone");
    await sql(`UPDATE nodes SET created_at = now() - interval '1 hour' WHERE id = $1`, [empty]);
    await sql(`UPDATE nodes SET lost_at = now(), last_report_at = now() - interval '1 hour' WHERE id = $1`, [gone]);
    const all = await findings();
    expect(about(all, "vps.hosts.capacity", empty)).toHaveLength(1);
    expect(about(all, "vps.hosts.silent", empty)).toHaveLength(1);
    expect(about(all, "vps.hosts.lost", gone)).toEqual([expect.objectContaining({ severity: "ERROR" })]);
    expect(about(all, "vps.hosts.silent", gone)).toEqual([]); // lost says more
    const live = (await hosts.h.platform.read((s) => s.query<{ id: string }>(`SELECT id FROM nodes WHERE name = 'host-1'`)))[0]?.id as string;
    expect(all.filter((f) => f.subject === live)).toEqual([]);
  });

  it("finds a provider account whose credentials the provider refuses", async () => {
    const { createProviderAccount: bad } = await hosts.h.operator.request(CreateProviderAccountDocument, {
      input: { name: "bad-token", provider: emu.provider, config: emu.config, credentials: { token: { value: "not-the-token" } } },
    });
    const { createProviderAccount: good } = await hosts.h.operator.request(CreateProviderAccountDocument, {
      input: { name: "good-token", provider: emu.provider, config: emu.config, credentials: { token: { value: emu.credentials.token as string } } },
    });
    await until("the sweep to check both accounts", async () => {
      const rows = await hosts.h.platform.read((s) =>
        s.query(`SELECT 1 FROM provider_accounts WHERE checked_at IS NOT NULL AND id IN ($1, $2)`, [bad.id, good.id]),
      );
      return rows.length === 2;
    });
    const all = await findings();
    expect(about(all, "vps.providers.credentials", bad.id)).toEqual([expect.objectContaining({ severity: "ERROR" })]);
    expect(all.filter((f) => f.subject === good.id)).toEqual([]);
    expect(JSON.stringify(all)).not.toContain(emu.credentials.token as string);
  });

  it("finds a warm pool that cannot fill", async () => {
    const t = await hosts.h.tenant();
    const full = await pool("no-room", "10.73.0.0/24"); // no host joined: nothing can be placed
    await hosts.h.operator.request(CreateFlavorDocument, { input: { poolId: full, name: "small", vcpus: 1, memoryMib: 512, diskGib: 5 } });
    const { createSandboxTemplate: tpl } = await t.client.request(CreateSandboxTemplateDocument, {
      input: { name: "stuck", poolId: full, flavor: "small", imageId: hosts.imageId, ttlSeconds: 60, warm: 1 },
    });
    expect(about(await findings(), "vps.sandboxes.warm", tpl.id)).toEqual([]); // just made: give it its time
    await sql(`UPDATE sandbox_templates SET updated_at = now() - interval '5 minutes' WHERE id = $1`, [tpl.id]);
    expect(about(await findings(), "vps.sandboxes.warm", tpl.id)).toEqual([expect.objectContaining({ message: expect.stringContaining("target 1, 0 ready") })]);
  });
});

describe("the accounting audit", () => {
  it("reports a removed lease, a stray allocation and a charge with no instance, in the doctor and in Pool.accounting", async () => {
    const t = await hosts.h.tenant();
    // Admission places and leases in its own transaction: the books hold it at once.
    const inst = (await t.client.request(CreateInstanceDocument, { input: { poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId } })).createInstance;
    const [lease] = await hosts.h.platform.read((s) =>
      s.query<{ address: string; nodeId: string }>(
        `SELECT l.address, i.node_id AS "nodeId" FROM ip_addresses l JOIN instances i ON i.id = l.instance_id WHERE l.instance_id = $1`,
        [inst.id],
      ),
    );
    const stray = "alloc_stray";
    await sql(`UPDATE ip_addresses SET instance_id = NULL, leased_at = NULL WHERE instance_id = $1`, [inst.id]);
    await sql(`INSERT INTO allocations (id, node_id, instance_id, tenant_id, vcpus, memory_mib, disk_gib) VALUES ($1, $2, 'inst_nobody', $3, 1, 512, 5)`, [
      stray,
      lease?.nodeId,
      t.id,
    ]);
    await sql(`UPDATE quota_usage SET used = used + 3 WHERE tenant_id = $1 AND resource = 'vcpus'`, [t.id]);

    // The stray allocation is unexplained, and unmetered too: no meter span counts its time.
    const kinds = ["allocation.unexplained", "allocation.unmetered", "instance.lease-missing", "node.counters", "quota.unexplained"];
    const audit = (await findings()).filter((f) => f.id.startsWith("vps.accounting."));
    expect(audit.map((f) => f.id).sort()).toEqual(kinds.map((k) => `vps.accounting.${k}`));
    expect(audit.map((f) => f.subject).sort()).toEqual([inst.id, lease?.nodeId, stray, stray, `${t.id}/vcpus`].sort());
    const accounting = async () => (await hosts.h.operator.request(PoolAccountingDocument, { id: hosts.poolId })).pool?.accounting;
    const seen = await accounting();
    expect(seen?.consistent).toBe(false);
    expect(seen?.drift.map((d) => d.kind).sort()).toEqual(kinds);
    expect(seen?.drift.find((d) => d.kind === "quota.unexplained")?.detail).toMatch(/usage \d+, live instances' charges \d+/);

    // Repaired, the books agree again.
    await sql(`UPDATE ip_addresses SET instance_id = $1, leased_at = now() WHERE address = $2`, [inst.id, lease?.address]);
    await sql(`DELETE FROM allocations WHERE id = $1`, [stray]);
    await sql(`UPDATE quota_usage SET used = used - 3 WHERE tenant_id = $1 AND resource = 'vcpus'`, [t.id]);
    expect(await accounting()).toEqual({ consistent: true, drift: [] });
  });
});
