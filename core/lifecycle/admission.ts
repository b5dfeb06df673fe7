import { z } from "zod";
import { AppError, isAppError, notFound } from "../../contracts/errors.ts";
import { chargeOf, type Shape, shape as shapeSchema } from "../catalog/shapes.ts";
import { eventMessage } from "../instances/changes.ts";
import { INSTANCE_COLUMNS, type Instance } from "../instances/model.ts";
import { sshPublicKey } from "../instances/ssh.ts";
import type { Sql } from "../kernel/db.ts";
import { instanceId } from "../kernel/ids.ts";
import type { Sealer } from "../kernel/seal.ts";
import { SQL } from "../kernel/sql.ts";
import { idempotencyKey, parseInput } from "../kernel/validation.ts";
import { ContendedWrite, type Write } from "../kernel/write.ts";
import type { AdmitRequest, DriverDeps, Pool, PoolDriver } from "../pools/driver.ts";
import { poolFromJson } from "../pools/pools.ts";
import { driverFor } from "../pools/registry.ts";
import { chargeRows, ensureUsageRows, needsUsageRows, quotaRefusal } from "../tenancy/quota.ts";
import {
  type Admission,
  type AdmissionEvent,
  type AdmissionRow,
  admissionStatement,
  type Caller,
  type Create,
  lookupStatement,
  type Outcome,
  type SandboxColumns,
} from "./admission-sql.ts";
import { admits, type Catalog, type LookupCache } from "./lookup.ts";

export type { Caller } from "./admission-sql.ts";

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
  sandbox?: SandboxColumns;
}

/**
 * Admit a create in the Write's transaction: idempotency, flavor, the pool driver's placement (hosted: a node
 * and an address), quota, the instance row and its first event. Any refusal throws and the transaction leaves
 * no trace. A replay of the same request returns the instance it made and changes nothing. In steps: the create
 * (createOf), its catalog (lookUp: remembered or read), the plan (planAdmission), then the one statement
 * (admission-sql.ts) sent and read (write), and the events it wrote recorded (admitted).
 */
export async function admitInstance(w: Write, deps: AdmissionDeps, caller: Caller, raw: CreateInstanceInput, opts: AdmitOptions = {}): Promise<Instance> {
  const create = createOf(deps, caller, raw);
  const looked = await lookUp(w, deps, create);
  if ("replay" in looked) return looked.replay;
  const admission = await planAdmission(w, deps, create, looked, opts);
  // The whole write: its last statement commits it (Sql.commitWith), and so must fail outright on a refusal.
  const row = await write(w, deps, create, admission, !!opts.commits && !!w.sql.commitWith);
  return admitted(w, admission, row);
}

/** The create as admission's statements read it, what it asks for, and where its catalog is remembered. */
export type Asked = Create & { desiredState: "running" | "stopped"; lookupKey: string };

export function createOf(deps: AdmissionDeps, caller: Caller, raw: CreateInstanceInput): Asked {
  const input = parseInput(createInput, raw);
  const key = input.idempotencyKey ?? deps.newIdempotencyKey();
  const id = instanceId(caller.tenantId, caller.identityId, key);
  // Keyed: the inputs include user data, which is sealed at rest and must not be confirmable from this column.
  const requestHash = deps.sealer.digest(
    JSON.stringify([input.poolId, input.flavor, input.imageId, input.sshKeys, input.userData ?? null, input.projectId ?? null, input.desiredState]),
    id,
  );
  // The image too, where the resolver can say it in SQL: hosted pools need it, and the lookup goes anyway.
  const image = deps.images.inStatement?.bind(deps.images);
  const lookupKey = JSON.stringify([caller.tenantId, input.poolId, input.flavor, input.imageId, input.projectId ?? null, !!image]);
  return { caller, input, key, id, requestHash, ...(image ? { image } : {}), desiredState: input.desiredState, lookupKey };
}

/**
 * The catalog the create is built on: remembered from an earlier create like it (the statement reads it again),
 * or read with whether the instance exists. A replay of the same request returns the instance it made.
 */
async function lookUp(w: Write, deps: AdmissionDeps, c: Asked): Promise<{ catalog: Catalog; remembered: boolean } | { replay: Instance }> {
  // A retry always looks up: the remembered catalog may be why the first attempt was refused.
  const remembered = w.attempt === 1 ? deps.lookups?.get(c.lookupKey) : undefined;
  if (remembered) return { catalog: remembered, remembered: true };
  // Identical creates race to the instance's primary key: the loser's write fails on it once the winner
  // commits and is run again by the write runner (infra/platform.ts), when this lookup finds the winner's row.
  const [row] = await w.sql.query<{ existing: boolean; sameRequest: boolean; catalog: Catalog }>(lookupStatement(c));
  if (row?.existing) {
    if (!row.sameRequest) throw new AppError("CONFLICT", `idempotency key ${c.key} was used for a different request`, { instanceId: c.id });
    const [inst] = await w.sql.query<Instance>(SQL`SELECT ${SQL.raw(INSTANCE_COLUMNS)} FROM instances WHERE id = ${c.id}`);
    w.unchanged();
    return { replay: inst as Instance };
  }
  const catalog = (row as NonNullable<typeof row>).catalog;
  if (admits(catalog)) deps.lookups?.set(c.lookupKey, catalog);
  return { catalog, remembered: false };
}

/** What the catalog says of the create (or NOT_FOUND), what its pool's driver holds for it, and what it is charged. */
export async function planAdmission(
  w: Write,
  deps: AdmissionDeps,
  c: Asked,
  looked: { catalog: Catalog; remembered: boolean },
  opts: AdmitOptions,
): Promise<Admission> {
  const { catalog, remembered } = looked;
  const { pool, driver, flavorName, shape } = named(c, catalog);
  const desiredState = opts.desiredState ?? c.desiredState;
  const request: AdmitRequest = {
    pool,
    tenantId: c.caller.tenantId,
    instanceId: c.id,
    imageId: c.input.imageId,
    ...(c.image ? { image: catalog.image ?? null } : {}),
    shape,
    desiredState,
    ...(opts.onlyNodeId ? { onlyNodeId: opts.onlyNodeId } : {}),
  };
  const placed = await driver.admit(w, request, deps).catch((e: unknown) => {
    // Placed step by step (GPUs, a restore's node), the driver can refuse before this create has read whether it
    // replays one, which a remembered catalog skipped: a replay in a full pool would be refused instead of getting
    // its instance. Such a refusal is a guess that missed; the next attempt looks the catalog, and the instance, up.
    if (remembered && isAppError(e)) throw new ContendedWrite(`the create of ${c.id} was placed on a remembered catalog and refused`, { guess: true });
    throw e;
  });
  const charge = opts.charge === false ? {} : chargeOf(shape);
  const { resources } = chargeRows(charge);
  if (needsUsageRows(resources)) await ensureUsageRows(w.sql, c.caller.tenantId, resources);
  return {
    create: c,
    catalog,
    remembered,
    flavorName,
    shape,
    desiredState,
    placed,
    events: eventsOf(c.caller, placed.converged?.steps ?? []),
    charge,
    userDataSealed: c.input.userData === undefined ? null : Buffer.from(deps.sealer.seal(c.input.userData, c.id)),
    audit: opts.audit !== false,
    ...(opts.sandbox ? { sandbox: opts.sandbox } : {}),
  };
}

/** The pool, its driver and the flavor the catalog has for the create, or NOT_FOUND for what it has not. */
function named(c: Asked, catalog: Catalog): { pool: Pool; driver: PoolDriver; flavorName: string; shape: Shape } {
  if (!catalog.pool) throw notFound("pool", c.input.poolId);
  const pool = poolFromJson(catalog.pool);
  const driver = driverFor(pool.class);
  if (!catalog.projectOk) throw notFound("project", c.input.projectId as string);
  if (!catalog.flavor) throw notFound("flavor", `${c.input.flavor} in pool ${c.input.poolId}`);
  return { pool, driver, flavorName: catalog.flavor.name, shape: parseInput(shapeSchema, catalog.flavor, "flavor") };
}

/** The first event is the create; the steps the driver proved follow it in order, one event and version each. */
function eventsOf(caller: Caller, steps: { to: AdmissionEvent["to_state"]; reason: string }[]): AdmissionEvent[] {
  return [
    { from_state: null, to_state: "pending", reason: "created", actor: caller.identityId, version: 1 },
    ...steps.map((s, k, all) => ({
      from_state: k === 0 ? "pending" : (all[k - 1]?.to as string),
      to_state: s.to,
      reason: s.reason,
      actor: "admission",
      version: k + 2,
    })),
  ];
}

/**
 * Send admission's statement and read its row. A charge that does not hold refuses the whole statement:
 * committing, it raises (admission_refused) and nothing stays; otherwise the caller throws, and its transaction
 * or savepoint takes the rows back (warm boots fall back to a savepoint; every other write ends on the error).
 */
async function write(w: Write, deps: AdmissionDeps, c: Asked, a: Admission, commits: boolean): Promise<Admitted> {
  const send = commits ? (w.sql.commitWith as NonNullable<Sql["commitWith"]>).bind(w.sql) : w.sql.query.bind(w.sql);
  let row: AdmissionRow | undefined;
  try {
    [row] = await send<AdmissionRow>(admissionStatement(w, a, commits));
  } catch (e) {
    if ((e as { code?: string }).code !== "BC001") throw e;
    row = { outcome: JSON.parse((e as { detail: string }).detail) as Outcome } as AdmissionRow;
  }
  if (!row?.eventIds) throw await refusal(w, deps, c, a, row?.outcome ?? { raised: null, held: null });
  return row as Admitted;
}

/** Why the statement took nothing: a remembered catalog that no longer holds, no address or node, or a limit. */
async function refusal(w: Write, deps: AdmissionDeps, c: Asked, a: Admission, outcome: Outcome): Promise<Error> {
  if (outcome.fresh && !(outcome.fresh.absent && outcome.fresh.same)) {
    // Not a refusal: the create was built on what is no longer so (or it is a replay). Run it again, looked up.
    if (!outcome.fresh.same) deps.lookups?.forget(c.lookupKey);
    return new ContendedWrite(`the create of ${c.id} was built on a remembered catalog that changed, or replays one`, { guess: true });
  }
  const deferred = a.placed.deferred;
  if (deferred && !outcome.held?.node_id) return deferred.refusal(w.sql, { addresses: outcome.held?.addresses ?? null, picked: outcome.held?.picked ?? null });
  return quotaRefusal(w.sql, c.caller.tenantId, a.charge, outcome.raised ?? []);
}

type Admitted = AdmissionRow & { eventIds: string[]; refused?: unknown };

/** The admitted instance, its events recorded on the Write. */
function admitted(w: Write, a: Admission, row: Admitted): Instance {
  const { eventIds, outcome: _, refused: __, ...instance } = row;
  for (const [k, e] of a.events.entries())
    w.event(eventMessage({ ...instance, state: e.to_state, version: e.version }, e.from_state, eventIds[k] as string), {
      desiredState: instance.desiredState,
      reason: e.reason,
      actor: e.actor,
      at: instance.createdAt,
      instance: { ...instance },
    });
  // The node's spec now holds the instance: its agent hears once this commits. Admission took every step that
  // needs no host, so a reconcile pass would find nothing to do before the host reports.
  if (a.placed.converged && instance.nodeId) {
    w.spec(instance.nodeId, instance.specGeneration);
    w.settle(instance.id);
  }
  return instance;
}
