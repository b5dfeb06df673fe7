import { createHash } from "node:crypto";
import { notFound } from "../../../contracts/errors.ts";
import { type InstanceSpec, macFor, type NetworkPolicy, type NodeSpec, type NodeSpecChange } from "../../../contracts/host.ts";
import { DEFAULT_RUNTIME } from "../../../contracts/runtimes.ts";
import { specPower } from "../../instances/decide.ts";
import type { DesiredState, InstanceState } from "../../instances/state.ts";
import type { Sql } from "../../kernel/db.ts";
import type { Sealer } from "../../kernel/seal.ts";
import { HELD_STATES } from "./generations.ts";
import { formatIpv4 } from "./ipam.ts";

/**
 * A node's spec: the whole desired set of its host — every instance it should hold, in which power state, with
 * image, keys, user data and NIC — and what to remove. A stream starts with it whole, so a reconnecting or
 * restarted agent converges from it without any history, then sends what changes (buildNodeSpecChange).
 */

const mac = (id: string) => macFor(id, (s) => createHash("sha256").update(s).digest("hex"));

/** The columns and joins of an instance's spec: `where` picks the rows (over `i`), `$1` is the node. */
const SPEC_ROWS = (where: string) =>
  `SELECT i.id, i.state, i.desired_state AS desired, i.vcpus, i.memory_mib AS "memoryMib", i.disk_gib AS "diskGib",
          i.image_url AS url, i.image_sha256 AS sha256, i.image_format AS format, i.ssh_keys AS "sshKeys",
          i.user_data_sealed AS sealed, i.addresses[1] AS address, ip.prefix, ip.network::text AS network,
          ip.gateway_offset AS "gatewayOffset", i.env, i.network_policy AS "networkPolicy", i.restore_from AS "restoreFrom",
          COALESCE((SELECT jsonb_agg(jsonb_build_object('model', g.model, 'pciAddress', g.pci_address) ORDER BY g.index)
                      FROM node_gpus g WHERE g.allocation_id = i.allocation_id), '[]') AS gpus
     FROM instances i LEFT JOIN ip_pools ip ON ip.pool_id = i.pool_id
    WHERE ${where}
    ORDER BY i.id`;
/** The instances a node holds (over `i`; `$1` the node, `$2` the held states). */
const IN_SET = `i.node_id = $1 AND i.allocation_id IS NOT NULL AND i.desired_state <> 'deleted' AND i.state = ANY($2::text[])`;

interface SpecRow {
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
  env: Record<string, string>;
  networkPolicy: NetworkPolicy | null;
  restoreFrom: { instanceId: string; snapshotId: string } | null;
}

const instanceSpecOf =
  (sealer: Sealer, hostNetwork: string) =>
  (r: SpecRow): InstanceSpec => ({
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
      bridge: hostNetwork,
      mac: mac(r.id),
      address: r.address,
      prefix: r.prefix,
      gateway: r.network !== null && r.gatewayOffset !== null ? formatIpv4(Number(r.network) + r.gatewayOffset) : null,
    },
    env: r.env,
    network: r.networkPolicy ?? { egress: "all", allow: [] },
    fromSnapshot: r.restoreFrom,
  });

/** The domains a node should remove (`$1` the node): deleted instances not yet gone, orphans marked for removal. */
const REMOVALS = `SELECT id FROM instances WHERE node_id = $1 AND desired_state = 'deleted' AND state <> 'deleted'
     UNION SELECT domain_id FROM orphans WHERE node_id = $1 AND removal_at IS NOT NULL ORDER BY 1`;

/** The whole desired set of a node, as its agent receives it: every instance is news to a reader that holds none. */
export async function buildNodeSpec(sql: Sql, sealer: Sealer, hostNetwork: string, nodeId: string): Promise<NodeSpec> {
  const { since: _, dropped: __, ...spec } = await buildNodeSpecChange(sql, sealer, hostNetwork, nodeId, -1, new Set());
  return spec;
}

/**
 * What changed in a node's desired set since generation `since`, for a reader that holds `held` (the ids it
 * was sent). An instance's `spec_generation` moves with every change the host must see (changes.ts), always
 * past every generation already committed, so those above `since`, and those the reader does not hold, are
 * all it needs; re-sending one it has is harmless. The rows are read by id only when something changed.
 */
export async function buildNodeSpecChange(
  sql: Sql,
  sealer: Sealer,
  hostNetwork: string,
  nodeId: string,
  since: number,
  held: ReadonlySet<string>,
): Promise<NodeSpecChange> {
  // One statement (a host waits on this after every change of its set): the node's head, the ids in its set
  // and what to remove, with the spec rows of the changed instances beside them (none: one row of NULLs).
  const rows = await sql.query<{ generation: number; runtime: string | null; held: string[]; remove: string[] } & (SpecRow | { [K in keyof SpecRow]: null })>(
    `WITH a AS (
       SELECT n.spec_generation AS generation, p.runtime, ARRAY(SELECT i.id FROM instances i WHERE ${IN_SET}) AS held,
              ARRAY(${REMOVALS}) AS remove
         FROM nodes n JOIN pools p ON p.id = n.pool_id WHERE n.id = $1)
     SELECT a.*, r.* FROM a LEFT JOIN LATERAL (${SPEC_ROWS(`${IN_SET} AND (i.spec_generation > $3 OR NOT (i.id = ANY($4::text[])))`)}) r ON true`,
    [nodeId, HELD_STATES, since, [...held]],
  );
  const [head] = rows;
  if (!head) throw notFound("node", nodeId);
  const now = new Set(head.held);
  return {
    nodeId,
    generation: head.generation,
    runtime: head.runtime ?? DEFAULT_RUNTIME,
    since,
    instances: rows.filter((r): r is typeof r & SpecRow => r.id !== null).map(instanceSpecOf(sealer, hostNetwork)),
    dropped: [...held].filter((id) => !now.has(id)).sort(),
    remove: head.remove,
  };
}
