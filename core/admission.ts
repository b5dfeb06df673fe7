import { z } from "zod";
import { audit } from "./audit.ts";
import type { Prisma, Tx } from "./db.ts";
import { AppError, invalid, notFound } from "./errors.ts";
import { type InstanceEventMessage, recordEvent } from "./events.ts";
import { type IdSource, instanceId, sha256Hex } from "./ids.ts";
import type { ImageResolver, ResolvedImage } from "./images.ts";
import { leaseAddress } from "./leases.ts";
import { type Placement, place } from "./placement.ts";
import { chargeQuota } from "./quota.ts";
import type { Sealer } from "./seal.ts";
import { chargeOf, parseInput, type Shape, shape as shapeSchema } from "./shapes.ts";
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
  instanceId: string;
  /** null on a replay: nothing changed, nothing to publish. */
  event: InstanceEventMessage | null;
}

/**
 * Admit a create in the caller's transaction: idempotency, image, flavor, placement, quota, address, the
 * instance row, its first event and the audit row. Any refusal throws and the transaction leaves no trace.
 */
export async function admitInstance(tx: Tx, deps: AdmissionDeps, caller: Caller, raw: CreateInstanceInput): Promise<Admitted> {
  const input = parseInput(createInput, raw);
  const key = input.idempotencyKey ?? deps.newIdempotencyKey();
  const id = instanceId(caller.tenantId, caller.identityId, key);
  const requestHash = sha256Hex(
    JSON.stringify([input.poolId, input.flavor, input.imageId, input.sshKeys, input.userData ?? null, input.projectId ?? null, input.desiredState]),
  );

  // Identical creates queue here rather than racing to the primary key and rolling back their claims.
  await tx.$executeRaw`SELECT pg_advisory_xact_lock(hashtextextended(${id}, 0))`;
  const existing = await tx.instance.findUnique({ where: { id }, select: { requestHash: true } });
  if (existing) {
    if (existing.requestHash !== requestHash) {
      throw new AppError("CONFLICT", `idempotency key ${key} was used for a different request`, { instanceId: id });
    }
    return { instanceId: id, event: null };
  }

  const pool = await tx.pool.findUnique({ where: { id: input.poolId } });
  if (!pool) throw notFound("pool", input.poolId);
  if (pool.class !== "vps-host" && pool.class !== "provider") throw invalid(`pool ${pool.id} is a ${pool.class} pool: instances need vps-host or provider`);
  if (input.projectId) {
    const project = await tx.project.findFirst({ where: { id: input.projectId, tenantId: caller.tenantId }, select: { id: true } });
    if (!project) throw notFound("project", input.projectId);
  }
  const flavor = await tx.flavor.findUnique({ where: { poolId_name: { poolId: pool.id, name: input.flavor } } });
  if (!flavor) throw notFound("flavor", `${input.flavor} in pool ${pool.id}`);
  const shape: Shape = parseInput(shapeSchema, { ...flavor, gpus: flavor.gpus }, "flavor");

  const hosted = pool.class === "vps-host";
  let image: ResolvedImage | undefined;
  if (hosted) {
    image = await deps.images.resolve(tx, caller.tenantId, input.imageId);
    if (!image) throw notFound("image", input.imageId);
  }

  // The instance row first: the allocation and the lease point at it.
  const charge = chargeOf(shape);
  const now = deps.now();
  await tx.instance.create({
    data: {
      id,
      tenantId: caller.tenantId,
      poolId: pool.id,
      projectId: input.projectId ?? null,
      ownerIdentityId: caller.identityId,
      idempotencyKey: key,
      requestHash,
      flavor: flavor.name,
      vcpus: shape.vcpus,
      memoryMib: shape.memoryMib,
      diskGib: shape.diskGib,
      gpus: shape.gpus,
      imageId: input.imageId,
      imageUrl: image?.url ?? null,
      imageSha256: image?.sha256 ?? null,
      imageFormat: image?.format ?? null,
      imageVerified: image?.verified ?? false,
      sshKeys: input.sshKeys,
      userDataSealed: input.userData === undefined ? null : deps.sealer.seal(input.userData, id),
      runtime: hosted ? (deps.runtimes[0] ?? null) : null,
      state: "pending",
      desiredState: input.desiredState,
      charge,
      createdAt: now,
      updatedAt: now,
    },
  });

  let placement: Placement | undefined;
  const addresses: string[] = [];
  if (hosted) {
    const singleTenant = (pool.policy as { singleTenant?: boolean }).singleTenant === true;
    placement = await place(tx, deps.ids, { poolId: pool.id, tenantId: caller.tenantId, instanceId: id, shape, singleTenant });
  }
  await chargeQuota(tx, caller.tenantId, charge);
  if (hosted) addresses.push(await leaseAddress(tx, pool.id, id, now));

  const inst = await tx.instance.update({
    where: { id },
    data: { nodeId: placement?.nodeId ?? null, allocationId: placement?.allocationId ?? null, addresses },
  });
  const event = await recordEvent(tx, inst, { from: null, reason: "created", actor: caller.identityId, at: now });
  await audit(tx, {
    actorId: caller.identityId,
    tenantId: caller.tenantId,
    action: "createInstance",
    targetId: id,
    requestId: caller.requestId ?? null,
    details: { poolId: pool.id, flavor: flavor.name, nodeId: placement?.nodeId ?? null, addresses } satisfies Prisma.InputJsonValue,
    at: now,
  });
  return { instanceId: id, event };
}
