import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startAgent } from "../../agent/index.ts";
import { renderRuleset } from "../../agent/network/ruleset.ts";
import { createFakeRuntime } from "../../agent/runtimes/fake/index.ts";
import { type NetworkPolicy, tapFor } from "../../contracts/host.ts";
import {
  CreateJoinTokenDocument,
  CreateSandboxDocument,
  CreateSandboxTemplateDocument,
  DeleteSandboxDocument,
  InstanceDocument,
  SandboxDocument,
  SandboxTemplateDocument,
  UpdateSandboxTemplateDocument,
} from "../../sdk/client.ts";
import { until } from "../support/fixtures.ts";
import { expectCode } from "../support/harness.ts";
import { type Hosts, startHosts } from "../support/hosts.ts";

/**
 * Egress allow entries, end to end: the API takes only what every host's ruleset holds, stored canonically; and a
 * policy a host cannot hold (stored before the API checked as strictly) costs its own sandbox, never the host.
 */

let hosts: Hosts;
let agent: Awaited<ReturnType<typeof startAgent>>;
let dir: string;
/** The taps of every ruleset the host loaded. */
const loaded: string[][] = [];
type Tenant = Awaited<ReturnType<Hosts["h"]["tenant"]>>;
let t: Tenant;

beforeAll(async () => {
  hosts = await startHosts(0, { SANDBOX_SWEEP_MS: "200" });
  t = await hosts.h.tenant();
  dir = mkdtempSync(join(tmpdir(), "bc-egress-input-"));
  const { createJoinToken } = await hosts.h.operator.request(CreateJoinTokenDocument, { poolId: hosts.poolId });
  agent = await startAgent({
    server: hosts.h.url,
    joinToken: createJoinToken.token,
    name: "egress-host",
    stateDir: dir,
    runtime: createFakeRuntime({ dir: join(dir, "fake-host"), capacity: { vcpus: 8, memoryMib: 16384, diskGib: 200, gpus: [] } }),
    heartbeatMs: 300,
    // Egress.apply up to nft: it renders, and a render that throws is its rejection.
    egress: {
      apply: async (policies: ReadonlyMap<string, NetworkPolicy>) => {
        renderRuleset(policies, { tapPrefix: "bct" });
        loaded.push([...policies.keys()]);
      },
    },
  });
  await until("the host to report", async () => (await hosts.h.platform.db.prisma.node.count({ where: { poolId: hosts.poolId, capVcpus: { gt: 0 } } })) === 1);
});
afterAll(async () => {
  await agent?.close();
  await hosts?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

let n = 0;
const template = async (extra: Record<string, unknown> = {}, who: Tenant = t) =>
  (
    await who.client.request(CreateSandboxTemplateDocument, {
      input: { name: `egress-${++n}`, poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId, ttlSeconds: 300, ...extra },
    })
  ).createSandboxTemplate;
const allowlist = (...allow: string[]) => ({ network: { egress: "ALLOWLIST" as const, allow } });
const writes = () =>
  hosts.h.platform.read(async (sql) => {
    const [r] = await sql.query<{ templates: number; audits: number }>(
      `SELECT (SELECT count(*)::int FROM sandbox_templates) AS templates, (SELECT count(*)::int FROM audit_log) AS audits`,
    );
    return r;
  });

describe("allow entries through the API", () => {
  it("are refused with INVALID_INPUT naming the entry, writing nothing, where a host would refuse them", async () => {
    const before = await writes();
    const e = await expectCode(template(allowlist("10.0.0.0/8:443/tcp", "010.000.000.001/32:80/tcp")), "INVALID_INPUT");
    expect(e.message).toMatch(
      /^INVALID_INPUT: input\.network\.allow\.1: "010\.000\.000\.001\/32:80\/tcp": "010\.000\.000\.001\/32" is not an IPv4 or IPv6 CIDR/,
    );
    for (const bad of ["10.0.0.1:80/tcp", "10.0.0.0/8:0/tcp", "10.0.0.0/8:443/icmp", "10.0.0.256/32:80/tcp"])
      await expectCode(template(allowlist(bad)), "INVALID_INPUT");
    expect(await writes()).toEqual(before);

    const tpl = await template(allowlist("10.0.0.0/8:443/tcp"));
    const created = await writes();
    await expectCode(t.client.request(UpdateSandboxTemplateDocument, { id: tpl.id, input: allowlist("010.000.000.001/32:80/tcp") }), "INVALID_INPUT");
    expect(await writes()).toEqual(created);
    expect((await t.client.request(SandboxTemplateDocument, { id: tpl.id })).sandboxTemplate).toMatchObject({
      version: 1,
      network: { egress: "ALLOWLIST", allow: ["10.0.0.0/8:443/tcp"] },
    });
  });

  it("are stored in the canonical form a host renders", async () => {
    const tpl = await template(allowlist("10.1.2.3/8:443/tcp", "2001:DB8::1/32:*/udp", "1.1.1.1/32:53/udp"));
    expect(tpl.network.allow).toEqual(["10.0.0.0/8:443/tcp", "2001:db8::/32:*/udp", "1.1.1.1/32:53/udp"]);
    const [row] = await hosts.h.platform.read((sql) => sql.query<{ network: NetworkPolicy }>(`SELECT network FROM sandbox_templates WHERE id = $1`, [tpl.id]));
    expect(row?.network.allow.map((r) => r.cidr)).toEqual(["10.0.0.0/8", "2001:db8::/32", "1.1.1.1/32"]);
  });
});

describe("a stored policy the host cannot enforce", () => {
  it("puts its own sandbox in error with the host's reason, while other tenants' sandboxes come and go", async () => {
    const bad = await template(allowlist("10.0.0.0/8:80/tcp"));
    // A row as the API stored it before it shared the host's parser.
    const db = new pg.Client({ connectionString: hosts.h.dbUrl });
    await db.connect();
    try {
      await db.query(`UPDATE sandbox_templates SET network = $2::jsonb WHERE id = $1`, [
        bad.id,
        JSON.stringify({ egress: "allowlist", allow: [{ cidr: "010.000.000.001/32", port: 80, proto: "tcp" }] }),
      ]);
    } finally {
      await db.end();
    }
    const { createSandbox: s } = await t.client.request(CreateSandboxDocument, { input: { templateId: bad.id } });
    const instance = async () => (await t.client.request(InstanceDocument, { id: s.instance.id })).instance;
    // On the host's spec from here on (placed), whatever the host has made of it yet.
    await expect.poll(async () => (await instance())?.nodeId, { timeout: 20_000, interval: 50 }).toBeTruthy();

    const other = await hosts.h.tenant();
    const good = await template(allowlist("10.0.0.0/8:443/tcp"), other);
    const { createSandbox: g } = await other.client.request(CreateSandboxDocument, { input: { templateId: good.id } });
    const state = (id: string) => async () => (await other.client.request(SandboxDocument, { id })).sandbox?.state;
    await expect.poll(state(g.id), { timeout: 20_000, interval: 50 }).toBe("RUNNING");

    await expect.poll(async () => (await instance())?.state, { timeout: 20_000, interval: 50 }).toBe("ERROR");
    expect((await instance())?.conditions).toContainEqual({
      type: "RuntimeError",
      reason: "HostReported",
      message: 'egress policy refused: policy.allow.0.cidr: not a CIDR: "010.000.000.001/32"',
    });
    expect(loaded.some((taps) => taps.includes(tapFor(g.instance.id)))).toBe(true);
    expect(loaded.some((taps) => taps.includes(tapFor(s.instance.id)))).toBe(false);
    await other.client.request(DeleteSandboxDocument, { id: g.id });
    await expect.poll(state(g.id), { timeout: 20_000, interval: 50 }).toBe("DELETED");
    await t.client.request(DeleteSandboxDocument, { id: s.id });
    await expect.poll(async () => (await t.client.request(SandboxDocument, { id: s.id })).sandbox?.state, { timeout: 20_000, interval: 50 }).toBe("DELETED");
  });
});
