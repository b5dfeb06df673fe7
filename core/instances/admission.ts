import { z } from "zod";
import type { InstanceEventMessage } from "../../contracts/channels.ts";
import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import type { ImageResolver, ResolvedImage } from "../catalog/images.ts";
import { chargeOf, parseInput, type Shape, shape as shapeSchema } from "../catalog/shapes.ts";
import { INSTANCE_COLUMNS, type Sql } from "../kernel/db.ts";
import { type IdSource, instanceId, sha256Hex } from "../kernel/ids.ts";
import type { Sealer } from "../kernel/seal.ts";
import { leaseAddress } from "../pools/hosted/leases.ts";
import { type Placement, place } from "../pools/hosted/placement.ts";
import { chargeQuota } from "../tenancy/quota.ts";
import { eventMessage, type InstanceRow } from "./changes.ts";
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
  idempotencyKey: z
    .string()
    .regex(/^[\x21-\x7e]{1,128}$/, "1 to 128 printable ASCII characters")
    .optional(),
});
export type CreateInstanceInput = z.input<typeof createInput>;

export interface AdmissionDeps {
  ids: IdSource;
  images: ImageResolver;
  sealer: Sealer;
  runtimes: readonly string[];
  now: () => Date;
  newIdempotencyKey: () => string;
}

export interface Caller {
  identityId: string;
  tenantId: string;
  requestId?: string;
}

export interface Admitted {
  instance: InstanceRow;
  /** null on a replay: nothing changed, nothing to publish. */
  event: InstanceEventMessage | null;
}

/**
 * Admit a create in the caller's transaction: idempotency, image, flavor, placement, quota, address, the
 * instance row, its first event and the audit row. Any refusal throws and the transaction leaves no trace.
 * Seven statements on the common path; each one is a guarded write or a lookup that cannot be merged.
 */
export async function admitInstance(sql: Sql, deps: AdmissionDeps, caller: Caller, raw: CreateInstanceInput): Promise<Admitted> {
  const input = parseInput(createInput, raw);
  const key = input.idempotencyKey ?? deps.newIdempotencyKey();
  const id = instanceId(caller.tenantId, caller.identityId, key);
  const requestHash = sha256Hex(
    JSON.stringify([input.poolId, input.flavor, input.imageId, input.sshKeys, input.userData ?? null, input.projectId ?? null, input.desiredState]),
  );

  // Identical creates queue here rather than racing to the primary key and rolling back their claims. The
  // lookups are a separate statement so that their snapshot is taken after the lock is held.
  await sql.query(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, [id]);
  const [found] = await sql.query<{
    existing: boolean;
    sameRequest: boolean;
    poolClass: string | null;
    singleTenant: boolean | null;
    flavor: (Shape & { name: string }) | null;
    projectOk: boolean;
  }>(
    `SELECT i.id IS NOT NULL AS existing, i.request_hash IS NOT DISTINCT FROM $6 AS "sameRequest",
            p.class AS "poolClass", (p.policy->>'singleTenant')::boolean AS "singleTenant",
            (SELECT jsonb_build_object('name', f.name, 'vcpus', f.vcpus, 'memoryMib', f.memory_mib, 'diskGib', f.disk_gib, 'gpus', f.gpus)
               FROM flavors f WHERE f.pool_id = p.id AND f.name = $3) AS flavor,
            ($4::text IS NULL OR EXISTS (SELECT 1 FROM projects WHERE id = $4 AND tenant_id = $5)) AS "projectOk"
       FROM (SELECT 1) one LEFT JOIN instances i ON i.id = $1 LEFT JOIN pools p ON p.id = $2`,
    [id, input.poolId, input.flavor, input.projectId ?? null, caller.tenantId, requestHash],
  );
  if (found?.existing) {
    if (!found.sameRequest) throw new AppError("CONFLICT", `idempotency key ${key} was used for a different request`, { instanceId: id });
    const [inst] = await sql.query<InstanceRow>(`SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = $1`, [id]);
    return { instance: inst as InstanceRow, event: null };
  }
  if (!found?.poolClass) throw notFound("pool", input.poolId);
  if (found.poolClass !== "vps-host" && found.poolClass !== "provider")
    throw invalid(`pool ${input.poolId} is a ${found.poolClass} pool: instances need vps-host or provider`);
  if (!found.projectOk) throw notFound("project", input.projectId as string);
  if (!found.flavor) throw notFound("flavor", `${input.flavor} in pool ${input.poolId}`);
  const shape: Shape = parseInput(shapeSchema, found.flavor, "flavor");

  const hosted = found.poolClass === "vps-host";
  let image: ResolvedImage | undefined;
  if (hosted) {
    image = await deps.images.resolve(sql, caller.tenantId, input.imageId);
    if (!image) throw notFound("image", input.imageId);
  }

  let placement: Placement | undefined;
  const addresses: string[] = [];
  const charge = chargeOf(shape);
  const now = deps.now();
  if (hosted)
    placement = await place(sql, deps.ids, {
      poolId: input.poolId,
      tenantId: caller.tenantId,
      instanceId: id,
      shape,
      singleTenant: found.singleTenant === true,
    });
  await chargeQuota(sql, caller.tenantId, charge);
  if (hosted) addresses.push(await leaseAddress(sql, input.poolId, id, now));

  const details = { poolId: input.poolId, flavor: shape, nodeId: placement?.nodeId ?? null, addresses };
  const [row] = await sql.query<InstanceRow & { eventId: string }>(
    `WITH i AS (
       INSERT INTO instances (id, tenant_id, pool_id, project_id, owner_identity_id, idempotency_key, request_hash, flavor, vcpus,
         memory_mib, disk_gib, gpus, image_id, image_url, image_sha256, image_format, image_verified, ssh_keys, user_data_sealed,
         runtime, state, desired_state, node_id, allocation_id, addresses, charge, version, created_at, updated_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb, $13, $14, $15, $16, $17, $18::text[], $19, $20, 'pending', $21,
         $22, $23, $24::text[], $25::jsonb, 1, $26, $26)
       RETURNING *),
     e AS (
       INSERT INTO instance_events (instance_id, tenant_id, pool_id, project_id, from_state, to_state, desired_state, reason, actor, version, at)
       SELECT id, tenant_id, pool_id, project_id, NULL, state, desired_state, 'created', $5, 1, $26 FROM i RETURNING id),
     a AS (
       INSERT INTO audit_log (actor_id, tenant_id, action, target_id, request_id, details, at)
       SELECT $5, $2, 'createInstance', id, $27, $28::jsonb, $26 FROM i)
     SELECT ${INSTANCE_COLUMNS}, (SELECT id::text FROM e) AS "eventId" FROM i`,
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
      image?.url ?? null,
      image?.sha256 ?? null,
      image?.format ?? null,
      image?.verified ?? false,
      input.sshKeys,
      input.userData === undefined ? null : Buffer.from(deps.sealer.seal(input.userData, id)),
      hosted ? (deps.runtimes[0] ?? null) : null,
      input.desiredState,
      placement?.nodeId ?? null,
      placement?.allocationId ?? null,
      addresses,
      JSON.stringify(charge),
      now,
      caller.requestId ?? null,
      JSON.stringify(details),
    ],
  );
  const { eventId, ...instance } = row as InstanceRow & { eventId: string };
  return { instance, event: eventMessage(instance, null, eventId) };
}
