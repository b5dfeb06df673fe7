import type { NetworkPolicy } from "../../contracts/host.ts";
import { openSpanSql, spanOwner, spanValues } from "../books/spans.ts";
import type { Shape } from "../catalog/shapes.ts";
import { INSTANCE_COLUMNS, type Instance } from "../instances/model.ts";
import type { DesiredState, InstanceState } from "../instances/state.ts";
import { type Fragment, SQL } from "../kernel/sql.ts";
import type { Write } from "../kernel/write.ts";
import type { Placed } from "../pools/driver.ts";
import { type Charge, chargeRows, chargeSql } from "../tenancy/quota.ts";
import { type Catalog, type CatalogKeys, catalogSql } from "./lookup.ts";

/**
 * Admission's statements, built from what the create is (core/lifecycle/admission.ts decides that): the lookup
 * that reads the catalog and a replay, and the one statement that holds, writes and charges. Pure but for what the
 * Write hands out (its time, ids and the audit row it is owed): the same create built twice is the same text.
 */

export interface Caller {
  identityId: string;
  tenantId: string;
}

/** What a sandbox's (or a warm pool's) instance carries beyond a plain one, written with its row. */
export interface SandboxColumns {
  sandboxId?: string;
  warmTemplate?: { id: string; version: number };
  env: Record<string, string>;
  networkPolicy: NetworkPolicy | null;
  restoreFrom?: { instanceId: string; snapshotId: string };
}

/** A create as admission's statements read it: the request, parsed, and what it is keyed by. */
export interface Create {
  caller: Caller;
  input: { poolId: string; flavor: string; imageId: string; sshKeys: string[]; userData?: string; projectId?: string };
  /** The idempotency key, the instance id it derives, and the keyed hash of the request. */
  key: string;
  id: string;
  requestHash: string;
  /** The image resolver's answer in SQL, where it can say it there (ImageResolver.inStatement). */
  image?: (imageId: Fragment, tenantId: Fragment) => Fragment;
}

/** One of the events admission writes: the create, then each step the driver proved. */
export interface AdmissionEvent {
  from_state: string | null;
  to_state: InstanceState;
  reason: string;
  actor: string;
  version: number;
}

/** Everything admission's statement is built from. */
export interface Admission {
  create: Create;
  /** The catalog the create was built on; `remembered`: from lookupCache, so the statement reads it again. */
  catalog: Catalog;
  remembered: boolean;
  flavorName: string;
  shape: Shape;
  desiredState: DesiredState;
  placed: Placed;
  events: AdmissionEvent[];
  charge: Charge;
  userDataSealed: Buffer | null;
  /** The statement writes the instance's audit row (Write.auditInStatement). */
  audit: boolean;
  sandbox?: SandboxColumns;
}

/** What admission's statement returns of what it saw; `fresh` only for a remembered catalog. */
export interface Outcome {
  raised: string[] | null;
  held: { node_id: string | null; addresses: string[] | null; picked: string | null } | null;
  fresh?: { absent: boolean; same: boolean } | null;
}
export type AdmissionRow = Instance & { eventIds: string[] | null; outcome: Outcome };

/** What the catalog is read by. */
const catalogKeys = (c: Create): CatalogKeys => ({
  pool: SQL.param(c.input.poolId),
  flavor: SQL.param(c.input.flavor),
  project: SQL.param(c.input.projectId ?? null),
  tenant: SQL.param(c.caller.tenantId),
  image: c.image ? SQL.param(c.input.imageId) : SQL`NULL`,
});

/** The lookup: whether the instance exists (and was asked for with the same request), and the catalog. */
export function lookupStatement(c: Create): Fragment {
  return SQL`SELECT i.id IS NOT NULL AS existing, i.request_hash IS NOT DISTINCT FROM ${c.requestHash} AS "sameRequest",
              ${catalogSql(catalogKeys(c), c.image)} AS catalog
         FROM (SELECT 1) one LEFT JOIN instances i ON i.id = ${c.id}`;
}

const COLUMNS = SQL.raw(INSTANCE_COLUMNS);

/**
 * Admission's one statement, hot rows last: the driver's deferred hold (hosted: the address, then the node) or
 * what it already took, then the instance, its events, its meter span and its audit row, and last the quota charge
 * (the tenant's rows, which every create of the tenant waits on). `commits`: it is the write's last statement
 * (Sql.commitWith), and so must fail outright on a refusal (admission_refused).
 */
export function admissionStatement(w: Write, a: Admission, commits: boolean): Fragment {
  const span = spanPart(w, a);
  const audit = auditPart(w, a);
  const { resources, amounts } = chargeRows(a.charge);
  // The charge's guard counts every row written before it: charge_quota's argument is evaluated before the
  // call, so this makes PostgreSQL run those inserts to completion first (a CTE runs when read).
  const chargeAfter = SQL.join(
    [
      SQL`(SELECT count(*) FROM e) > 0`,
      ...(span ? [SQL`EXISTS (SELECT FROM span) IS NOT NULL`] : []),
      ...(audit ? [SQL`EXISTS (SELECT FROM audited) IS NOT NULL`] : []),
    ],
    " AND ",
  );
  return SQL`WITH ${freshPart(a)}${heldPart(a)},
     i AS (
       ${instanceInsert(w, a)}),
     e AS (
       INSERT INTO instance_events (instance_id, tenant_id, pool_id, project_id, from_state, to_state, desired_state, reason, actor, version, at)
       SELECT i.id, i.tenant_id, i.pool_id, i.project_id, s.from_state, s.to_state, i.desired_state, s.reason, s.actor, s.version, i.created_at
         FROM i, jsonb_to_recordset(${JSON.stringify(a.events)}::jsonb) AS s(from_state text, to_state text, reason text, actor text, version int)
        ORDER BY s.version RETURNING id, version)
     ${span ? SQL`, span AS (${span} RETURNING 1)` : SQL.empty}
     ${audit ? SQL`, audited AS (${audit} RETURNING 1)` : SQL.empty},
     q AS (${chargeSql(a.create.caller.tenantId, resources, amounts, chargeAfter)}),
     outcome AS MATERIALIZED (
       SELECT (SELECT array_agg(resource) FROM q) AS raised, (SELECT to_jsonb(held) FROM held) AS held,
              (SELECT count(*) FROM q) = ${resources.length} AS whole
              ${a.remembered ? SQL`, (SELECT to_jsonb(fresh) FROM fresh) AS fresh` : SQL.empty})
     SELECT ${COLUMNS}, CASE WHEN outcome.whole THEN (SELECT array_agg(id::text ORDER BY version) FROM e) END AS "eventIds",
            to_jsonb(outcome) AS outcome
            ${commits ? SQL`, CASE WHEN i.id IS NULL OR NOT outcome.whole THEN admission_refused(to_jsonb(outcome)) END AS refused` : SQL.empty}
       FROM outcome LEFT JOIN i ON true`;
}

/**
 * A remembered catalog is read again, with whether the instance exists (a replay's lookup would have found it):
 * the statement takes nothing unless both are as the create was built on (heldPart's gate).
 */
function freshPart(a: Admission): Fragment {
  if (!a.remembered) return SQL.empty;
  return SQL`fresh AS (SELECT NOT EXISTS (SELECT FROM instances WHERE id = ${a.create.id}) AS absent,
         ${catalogSql(catalogKeys(a.create), a.create.image)} = ${JSON.stringify(a.catalog)}::jsonb AS same), `;
}

/** `held`: what the driver's deferred hold takes in this statement, or what the driver took already. */
function heldPart(a: Admission): Fragment {
  const gate = a.remembered ? SQL`EXISTS (SELECT FROM fresh WHERE absent AND same)` : SQL`true`;
  const { placed } = a;
  if (placed.deferred) return placed.deferred.ctes(gate);
  return SQL`held AS (SELECT ${placed.nodeId}::text AS node_id, ${placed.converged?.specGeneration ?? 0}::int AS generation,
                    ${placed.addresses}::text[] AS addresses, ${placed.allocationId}::text AS allocation_id, NULL::text AS picked
                     WHERE ${gate})`;
}

/** The instance's row, from `held`, written only where the hold was taken. */
function instanceInsert(w: Write, a: Admission): Fragment {
  const { create: c, placed, shape, sandbox } = a;
  const last = a.events[a.events.length - 1] as AdmissionEvent;
  // The hold was taken (a pool class that holds nothing on admission has nothing to take).
  const holds = SQL`(held.node_id IS NOT NULL OR ${!placed.nodeId && !placed.deferred}::boolean)`;
  return SQL`INSERT INTO instances (id, tenant_id, pool_id, project_id, owner_identity_id, idempotency_key, request_hash, flavor, vcpus,
         memory_mib, disk_gib, gpus, image_id, image_url, image_sha256, image_format, image_verified, ssh_keys, user_data_sealed,
         runtime, state, desired_state, node_id, allocation_id, addresses, charge, offer, sandbox_id, warm_template_id, warm_template_version, env,
         network_policy, restore_from, version, spec_generation, created_at, updated_at)
       SELECT ${c.id}, ${c.caller.tenantId}, ${c.input.poolId}, ${c.input.projectId ?? null}, ${c.caller.identityId}, ${c.key},
         ${c.requestHash}, ${a.flavorName}, ${shape.vcpus}, ${shape.memoryMib}, ${shape.diskGib}, ${JSON.stringify(shape.gpus)}::jsonb,
         ${c.input.imageId}, ${placed.image?.url ?? null}, ${placed.image?.sha256 ?? null}, ${placed.image?.format ?? null},
         ${placed.image?.verified ?? false}, ${c.input.sshKeys}::text[],
         ${a.userDataSealed}, ${placed.runtime}, ${last.to_state},
         ${a.desiredState}, held.node_id, held.allocation_id, COALESCE(held.addresses, '{}'), ${JSON.stringify(a.charge)}::jsonb, ${placed.offer ?? null},
         ${sandbox?.sandboxId ?? null}, ${sandbox?.warmTemplate?.id ?? null}, ${sandbox?.warmTemplate?.version ?? null},
         ${JSON.stringify(sandbox?.env ?? {})}::jsonb, ${sandbox?.networkPolicy ? JSON.stringify(sandbox.networkPolicy) : null}::jsonb,
         ${sandbox?.restoreFrom ? JSON.stringify(sandbox.restoreFrom) : null}::jsonb, ${last.version}, COALESCE(held.generation, 0),
         ${w.now}::timestamptz, ${w.now}::timestamptz
         FROM held
        WHERE ${holds}
       RETURNING *`;
}

/** The meter span of the allocation the instance holds (none for a pool class that allocates nothing). */
function spanPart(w: Write, a: Admission): Fragment | null {
  const { create: c, placed } = a;
  if (!placed.deferred && !placed.allocationId) return null;
  const owner = spanOwner({
    id: c.id,
    tenantId: c.caller.tenantId,
    projectId: c.input.projectId ?? null,
    warmTemplateId: a.sandbox?.warmTemplate?.id ?? null,
    claimedAt: null,
  });
  const values = spanValues(w, placed.allocationId ?? "", owner);
  return placed.deferred
    ? openSpanSql(values, SQL`made a JOIN i ON true`, SQL`true`, true) // the deferred hold is for requests without GPUs
    : openSpanSql(values, SQL`allocations a JOIN i ON true`, SQL`a.id = i.allocation_id`);
}

/** The instance's audit row, from the row the statement inserts; null where the caller audits its own subject. */
function auditPart(w: Write, a: Admission): Fragment | null {
  if (!a.audit) return null;
  return w.auditInStatement(
    { targetId: a.create.id, tenantId: a.create.caller.tenantId },
    SQL`jsonb_build_object('poolId', i.pool_id, 'flavor', ${JSON.stringify(a.shape)}::jsonb, 'nodeId', i.node_id, 'addresses', to_jsonb(i.addresses),
             'offer', i.offer)`,
    SQL`i`,
  );
}
