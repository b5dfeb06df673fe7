import { z } from "zod";
import { AppError, notFound } from "../../contracts/errors.ts";
import type { NetworkPolicy } from "../../contracts/host.ts";
import { openSpanSql, spanOwner, spanParams } from "../books/spans.ts";
import { chargeOf, type Shape, shape as shapeSchema } from "../catalog/shapes.ts";
import { instanceId } from "../kernel/ids.ts";
import type { Sealer } from "../kernel/seal.ts";
import { idempotencyKey, parseInput } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";
import type { DriverDeps, Pool } from "../pools/driver.ts";
import { driverFor } from "../pools/registry.ts";
import { chargeRows, chargeSql, ensureUsageRows, needsUsageRows, quotaRefusal } from "../tenancy/quota.ts";
import { eventMessage } from "./changes.ts";
import { INSTANCE_COLUMNS, type Instance } from "./model.ts";
import { sshPublicKey } from "./ssh.ts";

export const MAX_USER_DATA = 64 * 1024;

const createInput = z.object({
  poolId: z.string().min(1),
  flavor: z.string().min(1).max(64),
  imageId: z.string().min(1).max(256),
  sshKeys: z.array(sshPublicKey).max(32).default([]),
  userData: z
    .string()
    .refine((s) => Buffer.byteLength(s) <= MAX_USER_DATA, `at most ${MAX_USER_DATA} bytes`)
    .optional(),
  projectId: z.string().min(1).optional(),
  desiredState: z.enum(["running", "stopped"]).default("running"),
  idempotencyKey: idempotencyKey.optional(),
});
export type CreateInstanceInput = z.input<typeof createInput>;

export interface AdmissionDeps extends DriverDeps {
  sealer: Sealer;
  newIdempotencyKey: () => string;
}

export interface Caller {
  identityId: string;
  tenantId: string;
}

/**
 * Admit a create in the Write's transaction: idempotency, flavor, the pool driver's placement (hosted: a node
 * and an address), quota, the instance row and its first event. Any refusal throws and the transaction leaves
 * no trace. A replay of the same request returns the instance it made and changes nothing.
 */
/**
 * How a create differs when the platform makes the instance for its own purposes (sandboxes): a warm-pool
 * instance is charged to no one until claimed and waits paused; a sandbox's instance is audited as the sandbox.
 */
export interface AdmitOptions {
  /** Charge the tenant's quota (default true). */
  charge?: boolean;
  /** Write the audit row for the instance (default true); false when the caller audits its own subject. */
  audit?: boolean;
  /** Overrides the input's desired state (`paused`: a warm-pool instance). */
  desiredState?: "running" | "stopped" | "paused";
  /** Place it on this node only (a restore from a snapshot that node holds). */
  onlyNodeId?: string;
  /** What a sandbox's (or a warm pool's) instance carries beyond a plain one, written with its row. */
  sandbox?: {
    sandboxId?: string;
    warmTemplate?: { id: string; version: number };
    env: Record<string, string>;
    networkPolicy: NetworkPolicy | null;
    restoreFrom?: { instanceId: string; snapshotId: string };
  };
}

export async function admitInstance(w: Write, deps: AdmissionDeps, caller: Caller, raw: CreateInstanceInput, opts: AdmitOptions = {}): Promise<Instance> {
  const { sql } = w;
  const input = parseInput(createInput, raw);
  const key = input.idempotencyKey ?? deps.newIdempotencyKey();
  const id = instanceId(caller.tenantId, caller.identityId, key);
  // Keyed: the inputs include user data, which is sealed at rest and must not be confirmable from this column.
  const requestHash = deps.sealer.digest(
    JSON.stringify([input.poolId, input.flavor, input.imageId, input.sshKeys, input.userData ?? null, input.projectId ?? null, input.desiredState]),
    id,
  );

  // Identical creates queue here rather than racing to the primary key and rolling back their claims. The
  // lookups are a separate statement so that their snapshot is taken after the lock is held.
  await sql.query(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, [id]);
  const [found] = await sql.query<{
    existing: boolean;
    sameRequest: boolean;
    pool: (Omit<Pool, "createdAt"> & { createdAt: string }) | null;
    flavor: (Shape & { name: string }) | null;
    projectOk: boolean;
  }>(
    `SELECT i.id IS NOT NULL AS existing, i.request_hash IS NOT DISTINCT FROM $6 AS "sameRequest",
            CASE WHEN p.id IS NULL THEN NULL ELSE jsonb_build_object('id', p.id, 'name', p.name, 'class', p.class, 'agent', p.agent,
              'runtime', p.runtime, 'providerAccountId', p.provider_account_id,
              'singleTenant', COALESCE((p.policy->>'singleTenant')::boolean, false), 'createdAt', p.created_at) END AS pool,
            (SELECT jsonb_build_object('name', f.name, 'vcpus', f.vcpus, 'memoryMib', f.memory_mib, 'diskGib', f.disk_gib, 'gpus', f.gpus)
               FROM flavors f WHERE f.pool_id = p.id AND f.name = $3) AS flavor,
            ($4::text IS NULL OR EXISTS (SELECT 1 FROM projects WHERE id = $4 AND tenant_id = $5)) AS "projectOk"
       FROM (SELECT 1) one LEFT JOIN instances i ON i.id = $1 LEFT JOIN pools p ON p.id = $2`,
    [id, input.poolId, input.flavor, input.projectId ?? null, caller.tenantId, requestHash],
  );
  if (found?.existing) {
    if (!found.sameRequest) throw new AppError("CONFLICT", `idempotency key ${key} was used for a different request`, { instanceId: id });
    const [inst] = await sql.query<Instance>(`SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = $1`, [id]);
    w.unchanged();
    return inst as Instance;
  }
  if (!found?.pool) throw notFound("pool", input.poolId);
  const pool: Pool = { ...found.pool, createdAt: new Date(found.pool.createdAt) };
  const driver = driverFor(pool.class);
  if (!found.projectOk) throw notFound("project", input.projectId as string);
  if (!found.flavor) throw notFound("flavor", `${input.flavor} in pool ${input.poolId}`);
  const shape: Shape = parseInput(shapeSchema, found.flavor, "flavor");

  const desiredState = opts.desiredState ?? input.desiredState;
  const placed = await driver.admit(
    w,
    {
      pool,
      tenantId: caller.tenantId,
      instanceId: id,
      imageId: input.imageId,
      shape,
      desiredState,
      ...(opts.onlyNodeId ? { onlyNodeId: opts.onlyNodeId } : {}),
    },
    deps,
  );
  // The first event is the create; the steps the driver proved follow it in order, one event and version each.
  const events = [
    { from_state: null, to_state: "pending", reason: "created", actor: caller.identityId, version: 1 },
    ...(placed.converged?.steps ?? []).map((s, k, all) => ({
      from_state: k === 0 ? "pending" : (all[k - 1]?.to as string),
      to_state: s.to,
      reason: s.reason,
      actor: "admission",
      version: k + 2,
    })),
  ];
  const last = events[events.length - 1] as (typeof events)[number];
  const charge = opts.charge === false ? {} : chargeOf(shape);
  const { resources, amounts } = chargeRows(charge);
  if (needsUsageRows(resources)) await ensureUsageRows(sql, caller.tenantId, resources);

  // One statement for the rest, hot rows last: the quota charge (the tenant's rows, which every create of the
  // tenant waits on), then the instance, its events and its meter span only if the whole charge held. The
  // node row, claimed by the driver's placement, and these are then held for this statement and the commit.
  const owner = spanOwner({
    id,
    tenantId: caller.tenantId,
    projectId: input.projectId ?? null,
    warmTemplateId: opts.sandbox?.warmTemplate?.id ?? null,
    claimedAt: null,
  });
  const [row] = await sql.query<Instance & { eventIds: string[] | null; raised: string[] | null }>(
    `WITH q AS (${chargeSql("$2", "$38", "$39")}),
     i AS (
       INSERT INTO instances (id, tenant_id, pool_id, project_id, owner_identity_id, idempotency_key, request_hash, flavor, vcpus,
         memory_mib, disk_gib, gpus, image_id, image_url, image_sha256, image_format, image_verified, ssh_keys, user_data_sealed,
         runtime, state, desired_state, node_id, allocation_id, addresses, charge, offer, sandbox_id, warm_template_id, warm_template_version, env,
         network_policy, restore_from, version, spec_generation, created_at, updated_at)
       SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb, $13, $14, $15, $16, $17, $18::text[], $19, $20, $34, $21,
         $22, $23, $24::text[], $25::jsonb, $27, $28, $29, $30, $31::jsonb, $32::jsonb, $33::jsonb, $35, $36, $26::timestamptz, $26::timestamptz
       WHERE (SELECT count(*) FROM q) = $40
       RETURNING *),
     e AS (
       INSERT INTO instance_events (instance_id, tenant_id, pool_id, project_id, from_state, to_state, desired_state, reason, actor, version, at)
       SELECT i.id, i.tenant_id, i.pool_id, i.project_id, s.from_state, s.to_state, i.desired_state, s.reason, s.actor, s.version, $26
         FROM i, jsonb_to_recordset($37::jsonb) AS s(from_state text, to_state text, reason text, actor text, version int)
        ORDER BY s.version RETURNING id, version)
     ${placed.allocationId ? `, span AS (${openSpanSql((k) => `$${41 + k}`, " JOIN i ON true")})` : ""}
     SELECT ${INSTANCE_COLUMNS}, (SELECT array_agg(id::text ORDER BY version) FROM e) AS "eventIds",
            (SELECT array_agg(resource) FROM q) AS raised
       FROM (SELECT 1) one LEFT JOIN i ON true`,
    [
      id,
      caller.tenantId,
      input.poolId,
      input.projectId ?? null,
      caller.identityId,
      key,
      requestHash,
      found.flavor.name,
      shape.vcpus,
      shape.memoryMib,
      shape.diskGib,
      JSON.stringify(shape.gpus),
      input.imageId,
      placed.image?.url ?? null,
      placed.image?.sha256 ?? null,
      placed.image?.format ?? null,
      placed.image?.verified ?? false,
      input.sshKeys,
      input.userData === undefined ? null : Buffer.from(deps.sealer.seal(input.userData, id)),
      placed.runtime,
      desiredState,
      placed.nodeId,
      placed.allocationId,
      placed.addresses,
      JSON.stringify(charge),
      w.now,
      placed.offer ?? null,
      opts.sandbox?.sandboxId ?? null,
      opts.sandbox?.warmTemplate?.id ?? null,
      opts.sandbox?.warmTemplate?.version ?? null,
      JSON.stringify(opts.sandbox?.env ?? {}),
      opts.sandbox?.networkPolicy ? JSON.stringify(opts.sandbox.networkPolicy) : null,
      opts.sandbox?.restoreFrom ? JSON.stringify(opts.sandbox.restoreFrom) : null,
      last.to_state,
      last.version,
      placed.converged?.specGeneration ?? 0,
      JSON.stringify(events),
      resources,
      amounts,
      resources.length,
      ...(placed.allocationId ? spanParams(w, placed.allocationId, owner) : []),
    ],
  );
  if (!row?.eventIds) throw await quotaRefusal(sql, caller.tenantId, charge, row?.raised ?? []);
  const { eventIds, raised: _, ...instance } = row as Instance & { eventIds: string[]; raised: unknown };
  for (const [k, e] of events.entries())
    w.event(eventMessage({ ...instance, state: e.to_state as Instance["state"], version: e.version }, e.from_state, eventIds[k] as string));
  // The node's spec now holds the instance: its agent hears once this commits.
  if (placed.converged && placed.nodeId) w.spec(placed.nodeId, placed.converged.specGeneration);
  if (opts.audit !== false)
    w.audit({
      targetId: id,
      tenantId: caller.tenantId,
      details: { poolId: input.poolId, flavor: shape, nodeId: placed.nodeId, addresses: placed.addresses, offer: placed.offer ?? null },
    });
  return instance;
}
