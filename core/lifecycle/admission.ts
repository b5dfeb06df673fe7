import { z } from "zod";
import { AppError, isAppError, notFound } from "../../contracts/errors.ts";
import type { NetworkPolicy } from "../../contracts/host.ts";
import { openSpanSql, spanOwner, spanParams } from "../books/spans.ts";
import { chargeOf, type Shape, shape as shapeSchema } from "../catalog/shapes.ts";
import { eventMessage } from "../instances/changes.ts";
import { INSTANCE_COLUMNS, type Instance } from "../instances/model.ts";
import { sshPublicKey } from "../instances/ssh.ts";
import { instanceId } from "../kernel/ids.ts";
import type { Sealer } from "../kernel/seal.ts";
import { idempotencyKey, parseInput } from "../kernel/validation.ts";
import { ContendedWrite, type Write } from "../kernel/write.ts";
import type { DriverDeps } from "../pools/driver.ts";
import { poolFromJson } from "../pools/pools.ts";
import { driverFor } from "../pools/registry.ts";
import { chargeRows, chargeSql, ensureUsageRows, needsUsageRows, quotaRefusal } from "../tenancy/quota.ts";
import { admits, type Catalog, catalogSql, type LookupCache } from "./lookup.ts";

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
  /** Catalogs remembered from earlier creates (lookup.ts); without it every create looks its catalog up. */
  lookups?: LookupCache;
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
  /** This create is the whole write (createInstance): its last statement commits it, in the same round trip. */
  commits?: boolean;
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

  // The image too, where the resolver can say it in SQL: hosted pools need it, and this statement goes anyway.
  const image = deps.images.inStatement?.bind(deps.images);
  const lookupKey = JSON.stringify([caller.tenantId, input.poolId, input.flavor, input.imageId, input.projectId ?? null, !!image]);
  // A retry always looks up: the remembered catalog may be why the first attempt was refused.
  const remembered = w.attempt === 1 ? deps.lookups?.get(lookupKey) : undefined;
  let found: Catalog;
  if (remembered) found = remembered;
  else {
    // Identical creates race to the instance's primary key: the loser's write fails on it once the winner
    // commits and is run again by the write runner (infra/platform.ts), when this lookup finds the winner's row.
    const [row] = await sql.query<{ existing: boolean; sameRequest: boolean; catalog: Catalog }>(
      `SELECT i.id IS NOT NULL AS existing, i.request_hash IS NOT DISTINCT FROM $6 AS "sameRequest",
              ${catalogSql({ pool: "$2", flavor: "$3", project: "$4", tenant: "$5", image: "$7" }, image)} AS catalog
         FROM (SELECT 1) one LEFT JOIN instances i ON i.id = $1`,
      [id, input.poolId, input.flavor, input.projectId ?? null, caller.tenantId, requestHash, ...(image ? [input.imageId] : [])],
    );
    if (row?.existing) {
      if (!row.sameRequest) throw new AppError("CONFLICT", `idempotency key ${key} was used for a different request`, { instanceId: id });
      const [inst] = await sql.query<Instance>(`SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = $1`, [id]);
      w.unchanged();
      return inst as Instance;
    }
    found = (row as NonNullable<typeof row>).catalog;
    if (admits(found)) deps.lookups?.set(lookupKey, found);
  }
  if (!found.pool) throw notFound("pool", input.poolId);
  const pool = poolFromJson(found.pool);
  const driver = driverFor(pool.class);
  if (!found.projectOk) throw notFound("project", input.projectId as string);
  if (!found.flavor) throw notFound("flavor", `${input.flavor} in pool ${input.poolId}`);
  const shape: Shape = parseInput(shapeSchema, found.flavor, "flavor");

  const desiredState = opts.desiredState ?? input.desiredState;
  const request = {
    pool,
    tenantId: caller.tenantId,
    instanceId: id,
    imageId: input.imageId,
    ...(image ? { image: found.image ?? null } : {}),
    shape,
    desiredState,
    ...(opts.onlyNodeId ? { onlyNodeId: opts.onlyNodeId } : {}),
  };
  const placed = await driver.admit(w, request, deps).catch((e: unknown) => {
    // Placed step by step (GPUs, a restore's node), the driver can refuse before this create has read whether it
    // replays one, which a remembered catalog skipped: a replay in a full pool would be refused instead of getting
    // its instance. Such a refusal is a guess that missed; the next attempt looks the catalog, and the instance, up.
    if (remembered && isAppError(e)) throw new ContendedWrite(`the create of ${id} was placed on a remembered catalog and refused`, { guess: true });
    throw e;
  });
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

  // One statement for the rest, hot rows last: the driver's deferred hold (hosted: the address, then the node)
  // or what it already took, then the instance, its events, its meter span and its audit row, and last the
  // quota charge (the tenant's rows, which every create of the tenant waits on), so those rows are held for the
  // commit and little else. A charge that does not hold refuses the whole statement: committing, it raises
  // (admission_refused) and nothing stays; otherwise the caller throws, and its transaction or savepoint takes
  // the rows back (warm boots fall back to a savepoint; every other write ends on the error).
  const params: unknown[] = [];
  const add = (v: unknown) => {
    params.push(v);
    return `$${params.length}`;
  };
  // A remembered catalog is read again here, with whether the instance exists (a replay's lookup would have
  // found it): the statement takes nothing unless both are as the create was built on.
  const fresh = remembered
    ? `fresh AS (SELECT NOT EXISTS (SELECT FROM instances WHERE id = ${add(id)}) AS absent,
         ${catalogSql(
           {
             pool: add(input.poolId),
             flavor: add(input.flavor),
             project: add(input.projectId ?? null),
             tenant: add(caller.tenantId),
             image: image ? add(input.imageId) : "NULL",
           },
           image,
         )} = ${add(JSON.stringify(remembered))}::jsonb AS same), `
    : "";
  const gate = remembered ? "EXISTS (SELECT FROM fresh WHERE absent AND same)" : "true";
  const deferred = placed.deferred;
  let held: string;
  if (deferred) {
    const first = params.length;
    params.push(...deferred.params);
    held = deferred.ctes((k) => `$${first + k}`, gate);
  } else {
    held = `held AS (SELECT ${add(placed.nodeId)}::text AS node_id, ${add(placed.converged?.specGeneration ?? 0)}::int AS generation,
                    ${add(placed.addresses)}::text[] AS addresses, ${add(placed.allocationId)}::text AS allocation_id, NULL::text AS picked
                     WHERE ${gate})`;
  }
  // The hold was taken (a pool class that holds nothing on admission has nothing to take).
  const holds = `(held.node_id IS NOT NULL OR ${add(!placed.nodeId && !deferred)}::boolean)`;
  const owner = spanOwner({
    id,
    tenantId: caller.tenantId,
    projectId: input.projectId ?? null,
    warmTemplateId: opts.sandbox?.warmTemplate?.id ?? null,
    claimedAt: null,
  });
  // Placeholders only for the values the span's SQL reads (PostgreSQL refuses a parameter it cannot type).
  const spanValues = spanParams(w, placed.allocationId ?? "", owner);
  const spanAt = new Map<number, string>();
  const spanP = (k: number) => spanAt.get(k) ?? (spanAt.set(k, add(spanValues[k])).get(k) as string);
  const span = deferred
    ? openSpanSql(spanP, "made a JOIN i ON true", "true", true) // the deferred hold is for requests without GPUs
    : placed.allocationId
      ? openSpanSql(spanP, "allocations a JOIN i ON true", "a.id = i.allocation_id")
      : null;
  const audit =
    opts.audit === false
      ? null
      : w.auditInStatement(
          { targetId: id, tenantId: caller.tenantId },
          add,
          `jsonb_build_object('poolId', i.pool_id, 'flavor', ${add(JSON.stringify(shape))}::jsonb, 'nodeId', i.node_id, 'addresses', to_jsonb(i.addresses),
             'offer', i.offer)`,
          "i",
        );
  type Held = { node_id: string | null; addresses: string[] | null; picked: string | null };
  type Outcome = { raised: string[] | null; held: Held | null; fresh?: { absent: boolean; same: boolean } | null };
  type Row = Instance & { eventIds: string[] | null; outcome: Outcome };
  // The whole write: its last statement commits it (Sql.commitWith), and so must fail outright on a refusal.
  const commit = opts.commits ? (sql.commitWith as ((t: string, p: readonly unknown[]) => Promise<Row[]>) | undefined) : undefined;
  // The charge's guard counts every row written before it: charge_quota's argument is evaluated before the
  // call, so this makes PostgreSQL run those inserts to completion first (a CTE runs when read).
  const chargeAfter = [
    "(SELECT count(*) FROM e) > 0",
    ...(span ? ["EXISTS (SELECT FROM span) IS NOT NULL"] : []),
    ...(audit ? ["EXISTS (SELECT FROM audited) IS NOT NULL"] : []),
  ].join(" AND ");
  const text = `WITH ${fresh}${held},
     i AS (
       INSERT INTO instances (id, tenant_id, pool_id, project_id, owner_identity_id, idempotency_key, request_hash, flavor, vcpus,
         memory_mib, disk_gib, gpus, image_id, image_url, image_sha256, image_format, image_verified, ssh_keys, user_data_sealed,
         runtime, state, desired_state, node_id, allocation_id, addresses, charge, offer, sandbox_id, warm_template_id, warm_template_version, env,
         network_policy, restore_from, version, spec_generation, created_at, updated_at)
       SELECT ${add(id)}, ${add(caller.tenantId)}, ${add(input.poolId)}, ${add(input.projectId ?? null)}, ${add(caller.identityId)}, ${add(key)},
         ${add(requestHash)}, ${add(found.flavor.name)}, ${add(shape.vcpus)}, ${add(shape.memoryMib)}, ${add(shape.diskGib)}, ${add(JSON.stringify(shape.gpus))}::jsonb,
         ${add(input.imageId)}, ${add(placed.image?.url ?? null)}, ${add(placed.image?.sha256 ?? null)}, ${add(placed.image?.format ?? null)},
         ${add(placed.image?.verified ?? false)}, ${add(input.sshKeys)}::text[],
         ${add(input.userData === undefined ? null : Buffer.from(deps.sealer.seal(input.userData, id)))}, ${add(placed.runtime)}, ${add(last.to_state)},
         ${add(desiredState)}, held.node_id, held.allocation_id, COALESCE(held.addresses, '{}'), ${add(JSON.stringify(charge))}::jsonb, ${add(placed.offer ?? null)},
         ${add(opts.sandbox?.sandboxId ?? null)}, ${add(opts.sandbox?.warmTemplate?.id ?? null)}, ${add(opts.sandbox?.warmTemplate?.version ?? null)},
         ${add(JSON.stringify(opts.sandbox?.env ?? {}))}::jsonb, ${add(opts.sandbox?.networkPolicy ? JSON.stringify(opts.sandbox.networkPolicy) : null)}::jsonb,
         ${add(opts.sandbox?.restoreFrom ? JSON.stringify(opts.sandbox.restoreFrom) : null)}::jsonb, ${add(last.version)}, COALESCE(held.generation, 0),
         ${add(w.now)}::timestamptz, ${add(w.now)}::timestamptz
         FROM held
        WHERE ${holds}
       RETURNING *),
     e AS (
       INSERT INTO instance_events (instance_id, tenant_id, pool_id, project_id, from_state, to_state, desired_state, reason, actor, version, at)
       SELECT i.id, i.tenant_id, i.pool_id, i.project_id, s.from_state, s.to_state, i.desired_state, s.reason, s.actor, s.version, i.created_at
         FROM i, jsonb_to_recordset(${add(JSON.stringify(events))}::jsonb) AS s(from_state text, to_state text, reason text, actor text, version int)
        ORDER BY s.version RETURNING id, version)
     ${span ? `, span AS (${span} RETURNING 1)` : ""}
     ${audit ? `, audited AS (${audit} RETURNING 1)` : ""},
     q AS (${chargeSql(add(caller.tenantId), add(resources), add(amounts), chargeAfter)}),
     outcome AS MATERIALIZED (
       SELECT (SELECT array_agg(resource) FROM q) AS raised, (SELECT to_jsonb(held) FROM held) AS held,
              (SELECT count(*) FROM q) = ${add(resources.length)} AS whole
              ${remembered ? ", (SELECT to_jsonb(fresh) FROM fresh) AS fresh" : ""})
     SELECT ${INSTANCE_COLUMNS}, CASE WHEN outcome.whole THEN (SELECT array_agg(id::text ORDER BY version) FROM e) END AS "eventIds",
            to_jsonb(outcome) AS outcome
            ${commit ? ", CASE WHEN i.id IS NULL OR NOT outcome.whole THEN admission_refused(to_jsonb(outcome)) END AS refused" : ""}
       FROM outcome LEFT JOIN i ON true`;
  let row: Row | undefined;
  try {
    [row] = commit ? await commit.call(sql, text, params) : await sql.query<Row>(text, params);
  } catch (e) {
    if ((e as { code?: string }).code !== "BC001") throw e;
    row = { outcome: JSON.parse((e as { detail: string }).detail) as Outcome } as typeof row;
  }
  if (!row?.eventIds) {
    const outcome: Outcome = row?.outcome ?? { raised: null, held: null };
    if (outcome.fresh && !(outcome.fresh.absent && outcome.fresh.same)) {
      // Not a refusal: the create was built on what is no longer so (or it is a replay). Run it again, looked up.
      if (!outcome.fresh.same) deps.lookups?.forget(lookupKey);
      throw new ContendedWrite(`the create of ${id} was built on a remembered catalog that changed, or replays one`, { guess: true });
    }
    if (deferred && !outcome.held?.node_id)
      throw await deferred.refusal(sql, { addresses: outcome.held?.addresses ?? null, picked: outcome.held?.picked ?? null });
    throw await quotaRefusal(sql, caller.tenantId, charge, outcome.raised ?? []);
  }
  const { eventIds, outcome: _, ...instance } = row as Instance & { eventIds: string[]; outcome: unknown; refused?: unknown };
  for (const [k, e] of events.entries())
    w.event(eventMessage({ ...instance, state: e.to_state as Instance["state"], version: e.version }, e.from_state, eventIds[k] as string), {
      desiredState: instance.desiredState,
      reason: e.reason,
      actor: e.actor,
      at: instance.createdAt,
      instance: { ...instance },
    });
  // The node's spec now holds the instance: its agent hears once this commits. Admission took every step that
  // needs no host, so a reconcile pass would find nothing to do before the host reports.
  if (placed.converged && instance.nodeId) {
    w.spec(instance.nodeId, instance.specGeneration);
    w.settle(instance.id);
  }
  return instance;
}
