import { createHash, randomBytes } from "node:crypto";
import { AppError, notFound } from "../../../contracts/errors.ts";
import { type Capacity, type InstanceSpec, macFor, type NodeSpec, type StatusReport } from "../../../contracts/host.ts";
import { specPower } from "../../instances/decide.ts";
import type { DesiredState, InstanceState } from "../../instances/state.ts";
import type { Sql } from "../../kernel/db.ts";
import { type IdSource, randomIds, sha256Hex } from "../../kernel/ids.ts";
import type { Sealer } from "../../kernel/seal.ts";
import { formatIpv4 } from "./ipam.ts";

export interface HostSettings {
  /** A node silent for longer is `lost`, and so are the instances it runs. */
  lostGraceMs: number;
  /** A domain no instance owns is removed this long after it is first reported. */
  orphanGraceMs: number;
  hostNetwork: string;
}

/** A single-use join token for a pool; only its hash is stored. */
export async function createJoinToken(sql: Sql, ids: IdSource, poolId: string, ttlSeconds: number, now: Date) {
  const [pool] = await sql.query<{ class: string }>(`SELECT class FROM pools WHERE id = $1`, [poolId]);
  if (!pool) throw notFound("pool", poolId);
  if (pool.class !== "vps-host") throw new AppError("INVALID_INPUT", `pool ${poolId} is a ${pool.class} pool: only vps-host pools have hosts`);
  const token = `bcj_${randomBytes(24).toString("base64url")}`;
  const expiresAt = new Date(now.getTime() + ttlSeconds * 1000);
  await sql.query(`INSERT INTO join_tokens (id, pool_id, token_hash, expires_at, created_at) VALUES ($1, $2, $3, $4, $5)`, [
    ids("join"),
    poolId,
    sha256Hex(token),
    expiresAt,
    now,
  ]);
  return { token, expiresAt, poolId };
}

/**
 * Trade a join token for a node and its credential. The token works once and only before it expires; the
 * node gets its capacity from the agent's first report.
 */
export async function joinNode(sql: Sql, ids: IdSource, token: string, name: string, now: Date) {
  if (!/^[a-z0-9][a-z0-9.-]{0,62}$/.test(name)) throw new AppError("INVALID_INPUT", "node names are 1 to 63 lower-case letters, digits, . and -");
  const [jt] = await sql.query<{ id: string; pool_id: string }>(
    `UPDATE join_tokens SET used_at = $2 WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2 RETURNING id, pool_id`,
    [sha256Hex(token), now],
  );
  if (!jt) throw new AppError("UNAUTHENTICATED", "the join token is unknown, used or expired");
  const [taken] = await sql.query(`SELECT 1 FROM nodes WHERE pool_id = $1 AND name = $2`, [jt.pool_id, name]);
  if (taken) throw new AppError("CONFLICT", `a node named ${name} exists in this pool`);
  const nodeId = ids("node");
  const credential = `bcn_${randomBytes(32).toString("base64url")}`;
  await sql.query(`INSERT INTO nodes (id, pool_id, name, credential_hash, created_at) VALUES ($1, $2, $3, $4, $5)`, [
    nodeId,
    jt.pool_id,
    name,
    sha256Hex(credential),
    now,
  ]);
  await sql.query(`UPDATE join_tokens SET node_id = $2 WHERE id = $1`, [jt.id, nodeId]);
  return { nodeId, credential, poolId: jt.pool_id };
}

export async function nodeForCredential(sql: Sql, credential: string): Promise<string | null> {
  const [n] = await sql.query<{ id: string }>(`SELECT id FROM nodes WHERE credential_hash = $1 AND gone_at IS NULL`, [sha256Hex(credential)]);
  return n?.id ?? null;
}

/** Bump the spec generation of nodes whose desired set changed; returns the new generation of each. */
export async function bumpSpecs(sql: Sql, nodeIds: readonly (string | null | undefined)[]): Promise<{ nodeId: string; generation: number }[]> {
  const unique = [...new Set(nodeIds.filter((n): n is string => !!n))].sort();
  if (!unique.length) return [];
  return sql.query<{ nodeId: string; generation: number }>(
    `UPDATE nodes SET spec_generation = spec_generation + 1 WHERE id = ANY($1::text[]) RETURNING id AS "nodeId", spec_generation AS generation`,
    [unique],
  );
}

const mac = (id: string) => macFor(id, (s) => createHash("sha256").update(s).digest("hex"));

/** States in which the host should hold the domain (with the power specPower gives). */
export const HELD_STATES: readonly InstanceState[] = ["provisioning", "starting", "running", "stopped", "paused", "resizing", "rebooting", "error", "lost"];

/** The whole desired set of a node, as its agent receives it. */
export async function buildNodeSpec(sql: Sql, sealer: Sealer, settings: Pick<HostSettings, "hostNetwork">, nodeId: string): Promise<NodeSpec> {
  const [node] = await sql.query<{ generation: number; runtime: string | null }>(
    `SELECT n.spec_generation AS generation, p.runtime FROM nodes n JOIN pools p ON p.id = n.pool_id WHERE n.id = $1`,
    [nodeId],
  );
  if (!node) throw notFound("node", nodeId);
  const rows = await sql.query<{
    id: string;
    state: InstanceState;
    desired: DesiredState;
    vcpus: number;
    memoryMib: number;
    diskGib: number;
    url: string;
    sha256: string;
    format: "raw" | "qcow2" | "iso";
    sshKeys: string[];
    sealed: Uint8Array | null;
    address: string | null;
    prefix: number | null;
    network: string | null;
    gatewayOffset: number | null;
    gpus: { model: string; pciAddress: string | null }[];
  }>(
    `SELECT i.id, i.state, i.desired_state AS desired, i.vcpus, i.memory_mib AS "memoryMib", i.disk_gib AS "diskGib",
            i.image_url AS url, i.image_sha256 AS sha256, i.image_format AS format, i.ssh_keys AS "sshKeys",
            i.user_data_sealed AS sealed, i.addresses[1] AS address, ip.prefix, ip.network::text AS network,
            ip.gateway_offset AS "gatewayOffset",
            COALESCE((SELECT jsonb_agg(jsonb_build_object('model', g.model, 'pciAddress', g.pci_address) ORDER BY g.index)
                        FROM node_gpus g WHERE g.allocation_id = i.allocation_id), '[]') AS gpus
       FROM instances i LEFT JOIN ip_pools ip ON ip.pool_id = i.pool_id
      WHERE i.node_id = $1 AND i.allocation_id IS NOT NULL AND i.desired_state <> 'deleted' AND i.state = ANY($2::text[])
      ORDER BY i.id`,
    [nodeId, HELD_STATES],
  );
  const instances: InstanceSpec[] = rows.map((r) => ({
    id: r.id,
    power: specPower(r.state, r.desired),
    vcpus: r.vcpus,
    memoryMib: r.memoryMib,
    diskGib: r.diskGib,
    gpus: r.gpus,
    image: { url: r.url, sha256: r.sha256, format: r.format },
    sshKeys: r.sshKeys,
    userData: r.sealed ? sealer.open(r.sealed, r.id) : null,
    hostname: r.id.slice(0, 20).replace(/_/g, "-"),
    nic: {
      bridge: settings.hostNetwork,
      mac: mac(r.id),
      address: r.address,
      prefix: r.prefix,
      gateway: r.network !== null && r.gatewayOffset !== null ? formatIpv4(Number(r.network) + r.gatewayOffset) : null,
    },
  }));
  const remove = await sql.query<{ id: string }>(
    `SELECT id FROM instances WHERE node_id = $1 AND desired_state = 'deleted' AND state <> 'deleted'
     UNION SELECT domain_id FROM orphans WHERE node_id = $1 AND removal_at IS NOT NULL ORDER BY 1`,
    [nodeId],
  );
  return { nodeId, generation: node.generation, runtime: node.runtime ?? "libvirt-kvm", instances, remove: remove.map((r) => r.id) };
}

/**
 * The instanceStatusHandler: record what a host reports and say which instances to wake. An observation is
 * written only when it says something new (heartbeats change nothing), and counts for the reconciler once
 * the report's generation has caught up with the instance's last change.
 */
export async function recordReport(
  sql: Sql,
  nodeId: string,
  report: StatusReport,
  now: Date,
): Promise<{ wake: string[]; recovered: boolean; generation: number }> {
  // Lock order, everywhere: instance rows before node rows (an instance change bumps its node's generation).
  // So the node row is read here without a lock and written last.
  const [node] = await sql.query<{ wasLost: boolean }>(`SELECT lost_at IS NOT NULL AS "wasLost" FROM nodes WHERE id = $1 AND gone_at IS NULL`, [nodeId]);
  if (!node) throw new AppError("UNAUTHENTICATED", `node ${nodeId} is gone`);
  const seen = report.instances.map((i) => ({ ...i, shape: i.shape ?? null }));
  const changed = await sql.query<{ id: string }>(
    `UPDATE instances i SET observed_state = r.state, observed_error = r.error, observed_retryable = r.retryable,
            observed_shape = r.shape, observed_generation = $2, observed_at = $3
       FROM jsonb_to_recordset($4::jsonb) AS r(id text, state text, error text, retryable boolean, shape jsonb)
      WHERE i.id = r.id AND i.node_id = $1 AND i.state <> 'deleted'
        AND (i.observed_state IS DISTINCT FROM r.state OR i.observed_error IS DISTINCT FROM r.error
             OR i.observed_shape IS DISTINCT FROM r.shape OR (i.observed_generation < i.spec_generation AND $2 >= i.spec_generation))
      RETURNING i.id`,
    [nodeId, report.generation, now, JSON.stringify(seen)],
  );
  const ids = seen.map((i) => i.id);
  const vanished = await sql.query<{ id: string }>(
    `UPDATE instances SET observed_state = 'absent', observed_error = NULL, observed_generation = $2, observed_at = $3
      WHERE node_id = $1 AND state <> 'deleted' AND NOT (id = ANY($4::text[]))
        AND (observed_state IS DISTINCT FROM 'absent' OR (observed_generation < spec_generation AND $2 >= spec_generation))
      RETURNING id`,
    [nodeId, report.generation, now, ids],
  );
  // Domains no instance on this node owns are orphans; one that is owned again, or gone, is not.
  await sql.query(
    `INSERT INTO orphans (node_id, domain_id, first_seen_at)
     SELECT $1, d, $2 FROM unnest($3::text[]) AS d
      WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = d AND i.node_id = $1 AND i.state <> 'deleted')
     ON CONFLICT DO NOTHING`,
    [nodeId, now, ids],
  );
  await sql.query(
    `DELETE FROM orphans o WHERE o.node_id = $1
        AND (NOT (o.domain_id = ANY($2::text[])) OR EXISTS (SELECT 1 FROM instances i WHERE i.id = o.domain_id AND i.node_id = $1 AND i.state <> 'deleted'))`,
    [nodeId, ids],
  );
  const [updated] = await sql.query<{ generation: number }>(
    `UPDATE nodes SET last_report_at = $2, reported_generation = $3, lost_at = NULL WHERE id = $1 RETURNING spec_generation AS generation`,
    [nodeId, now, report.generation],
  );
  await applyReportedCapacity(sql, nodeId, report.capacity);
  let wake = [...changed, ...vanished].map((r) => r.id);
  if (node.wasLost) {
    const all = await sql.query<{ id: string }>(`SELECT id FROM instances WHERE node_id = $1 AND state <> 'deleted'`, [nodeId]);
    wake = all.map((r) => r.id);
  }
  return { wake: [...new Set(wake)], recovered: node.wasLost, generation: updated?.generation ?? 0 };
}

/** What the host says it has, never below what is already allocated on it (placed instances keep their claim). */
async function applyReportedCapacity(sql: Sql, nodeId: string, cap: Capacity): Promise<void> {
  await sql.query(
    `UPDATE nodes SET cap_vcpus = GREATEST($2, alloc_vcpus), cap_memory_mib = GREATEST($3, alloc_memory_mib), cap_disk_gib = GREATEST($4, alloc_disk_gib)
      WHERE id = $1 AND (cap_vcpus, cap_memory_mib, cap_disk_gib) IS DISTINCT FROM (GREATEST($2, alloc_vcpus), GREATEST($3, alloc_memory_mib), GREATEST($4, alloc_disk_gib))`,
    [nodeId, cap.vcpus, cap.memoryMib, cap.diskGib],
  );
  const have = await sql.query<{ id: string; model: string; pci: string | null; held: boolean; index: number }>(
    `SELECT id, model, pci_address AS pci, allocation_id IS NOT NULL AS held, index FROM node_gpus WHERE node_id = $1 ORDER BY index`,
    [nodeId],
  );
  const key = (g: { model: string; pci: string | null }) => `${g.model}@${g.pci ?? ""}`;
  const want = cap.gpus.map((g) => ({ model: g.model, pci: g.pciAddress }));
  const missing = want.filter((w) => !have.some((h) => key(h) === key(w)));
  const extra = have.filter((h) => !h.held && !want.some((w) => key(w) === key(h)));
  if (extra.length) await sql.query(`DELETE FROM node_gpus WHERE id = ANY($1::text[])`, [extra.map((g) => g.id)]);
  let next = have.reduce((m, g) => Math.max(m, g.index + 1), 0);
  for (const g of missing) {
    await sql.query(`INSERT INTO node_gpus (id, node_id, model, index, pci_address) VALUES ($1, $2, $3, $4, $5)`, [
      randomIds("gpu"),
      nodeId,
      g.model,
      next++,
      g.pci,
    ]);
  }
}

/** Nodes silent past the grace become lost; returns the instances to wake. */
export async function markLostNodes(sql: Sql, graceMs: number, now: Date): Promise<string[]> {
  const rows = await sql.query<{ id: string }>(
    `WITH lost AS (
       UPDATE nodes SET lost_at = $1 WHERE lost_at IS NULL AND gone_at IS NULL AND last_report_at < $2 RETURNING id)
     SELECT i.id FROM instances i JOIN lost ON lost.id = i.node_id WHERE i.state <> 'deleted'`,
    [now, new Date(now.getTime() - graceMs)],
  );
  return rows.map((r) => r.id);
}

/** Orphans past the grace go into their node's spec for removal; returns the nodes whose spec changed. */
export async function announceOrphanRemovals(sql: Sql, graceMs: number, now: Date): Promise<string[]> {
  const rows = await sql.query<{ node_id: string }>(`UPDATE orphans SET removal_at = $1 WHERE removal_at IS NULL AND first_seen_at < $2 RETURNING node_id`, [
    now,
    new Date(now.getTime() - graceMs),
  ]);
  return [...new Set(rows.map((r) => r.node_id))];
}

/** An operator's word that a host will not come back: its instances are recreated elsewhere. */
export async function declareNodeGone(sql: Sql, nodeId: string, now: Date): Promise<string[]> {
  const [node] = await sql.query<{ id: string }>(
    `UPDATE nodes SET gone_at = COALESCE(gone_at, $2), state = 'cordoned', credential_hash = NULL WHERE id = $1 RETURNING id`,
    [nodeId, now],
  );
  if (!node) throw notFound("node", nodeId);
  const rows = await sql.query<{ id: string }>(`SELECT id FROM instances WHERE node_id = $1 AND state <> 'deleted'`, [nodeId]);
  return rows.map((r) => r.id);
}
