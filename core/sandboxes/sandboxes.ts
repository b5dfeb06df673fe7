import { z } from "zod";
import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import type { Principal } from "../auth/principal.ts";
import { visibleTo } from "../auth/principal.ts";
import { handOverSpan, spanOwner } from "../books/spans.ts";
import { chargeOf } from "../catalog/shapes.ts";
import { lockInstance, writeChange } from "../instances/changes.ts";
import { INSTANCE_COLUMNS, type Instance } from "../instances/model.ts";
import { one, type Sql } from "../kernel/db.ts";
import { derivedId } from "../kernel/ids.ts";
import { idempotencyKey, parseInput } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";
import { type AdmissionDeps, admitInstance } from "../lifecycle/admission.ts";
import { driverFor } from "../pools/registry.ts";
import { chargeQuota } from "../tenancy/quota.ts";
import { lockSandbox, SANDBOX_COLUMNS, type Sandbox } from "./model.ts";
import { restorable } from "./snapshots.ts";
import { envOf, type SandboxTemplate, TEMPLATE_COLUMNS } from "./templates.ts";
import { REFILL_DELAY_MS } from "./warm.ts";

export { lockSandbox, SANDBOX_COLUMNS, type Sandbox } from "./model.ts";

/**
 * Sandboxes: one instance each, with a deadline. A create claims a warm instance of the template's current
 * version when one is paused and ready — under FOR UPDATE SKIP LOCKED, so concurrent creates never share one —
 * charges the tenant's quota for it then, and asks it to run: its pool's driver resumes it at once (hosted: a
 * command straight to its host; the spec says the same, for a host that misses the command); with
 * none ready it boots one cold. The sandbox's state is its instance's.
 */
const createInput = z.object({
  templateId: z.string().min(1).nullish(),
  snapshotId: z.string().min(1).nullish(),
  ttlSeconds: z.number().int().min(1).nullish(),
  idempotencyKey: idempotencyKey.nullish(),
});
export type CreateSandboxInput = z.input<typeof createInput>;

/** Like instance ids: who asked and their key decide the id, so a replayed create lands on the same row. */
const sandboxId = (tenantId: string, callerId: string, key: string) => derivedId("sbx", ["sandbox", tenantId, callerId, key], 32);

export async function createSandbox(w: Write, deps: AdmissionDeps, who: Principal & { tenantId: string }, raw: CreateSandboxInput): Promise<Sandbox> {
  const input = parseInput(createInput, raw);
  if (!input.templateId === !input.snapshotId) throw invalid("input: name a templateId or a snapshotId", { path: "input.templateId" });
  const key = input.idempotencyKey ?? deps.newIdempotencyKey();
  const id = sandboxId(who.tenantId, who.identityId, key);
  // Keyed like instances' request hashes (core/lifecycle/admission.ts), so both columns read the same way.
  const requestHash = deps.sealer.digest(JSON.stringify([input.templateId ?? null, input.snapshotId ?? null, input.ttlSeconds ?? null]), id);
  await w.sql.query(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, [id]);
  const existing = await one<Sandbox>(w.sql, `SELECT ${SANDBOX_COLUMNS} FROM sandboxes s WHERE s.id = $1`, [id]);
  if (existing) {
    if (existing.requestHash !== requestHash) throw new AppError("CONFLICT", `idempotency key ${key} was used for a different sandbox`, { sandboxId: id });
    w.unchanged();
    return existing;
  }
  if (input.snapshotId) return restoreSandbox(w, deps, who, { id, key, requestHash, snapshotId: input.snapshotId, ttlSeconds: input.ttlSeconds ?? null });
  const t = await one<SandboxTemplate>(w.sql, `SELECT ${TEMPLATE_COLUMNS} FROM sandbox_templates WHERE id = $1`, [input.templateId]);
  if (!t || t.tenantId !== who.tenantId) throw notFound("sandbox template", input.templateId as string);
  const ttl = input.ttlSeconds ?? t.ttlSeconds;
  if (ttl > t.maxTtlSeconds) throw invalid(`input.ttlSeconds: at most the template's maxTtlSeconds (${t.maxTtlSeconds})`, { path: "input.ttlSeconds" });

  const inst = (await claimWarm(w, t, who, id)) ?? (await bootCold(w, deps, t, who, id, key));
  const warm = inst.claimedAt !== null;
  const sandbox = await insertSandbox(w, {
    id,
    tenantId: who.tenantId,
    ownerIdentityId: who.identityId,
    templateId: t.id,
    templateVersion: t.version,
    fromSnapshotId: null,
    instanceId: inst.id,
    idempotencyKey: key,
    requestHash,
    ttlSeconds: ttl,
    maxTtlSeconds: t.maxTtlSeconds,
    warm,
  });
  w.audit({ targetId: id, tenantId: who.tenantId, details: { templateId: t.id, version: t.version, instanceId: inst.id, warm } });
  // A claim leaves the pool one short: the reconciler boots its replacement a moment later (warm.ts says why).
  if (warm) w.wakeSandboxes(REFILL_DELAY_MS);
  return sandbox;
}

/**
 * A new sandbox from a snapshot: its instance is placed on the host holding the snapshot and made from it
 * (`restore_from`, which the host spec carries), running on from the saved point with its own identity. It keeps
 * the source sandbox's template, env and network policy; its lifetime is the source's unless the create says.
 */
async function restoreSandbox(
  w: Write,
  deps: AdmissionDeps,
  who: Principal & { tenantId: string },
  r: { id: string; key: string; requestHash: string; snapshotId: string; ttlSeconds: number | null },
): Promise<Sandbox> {
  const snap = await restorable(w, who, r.snapshotId);
  const src = (await one<Instance>(w.sql, `SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = $1`, [snap.instanceId])) as Instance;
  const from = (await one<Sandbox>(w.sql, `SELECT ${SANDBOX_COLUMNS} FROM sandboxes s WHERE s.id = $1`, [snap.sandboxId])) as Sandbox;
  const ttl = r.ttlSeconds ?? from.ttlSeconds;
  if (ttl > from.maxTtlSeconds) throw invalid(`input.ttlSeconds: at most ${from.maxTtlSeconds}`, { path: "input.ttlSeconds" });
  const admitted = await admitInstance(
    w,
    deps,
    { identityId: who.identityId, tenantId: who.tenantId },
    { poolId: src.poolId, flavor: src.flavor, imageId: src.imageId, idempotencyKey: `sandbox:${r.key}` },
    {
      audit: false,
      onlyNodeId: snap.nodeId,
      sandbox: { sandboxId: r.id, env: src.env, networkPolicy: src.networkPolicy, restoreFrom: { instanceId: src.id, snapshotId: snap.id } },
    },
  );
  const sandbox = await insertSandbox(w, {
    id: r.id,
    tenantId: who.tenantId,
    ownerIdentityId: who.identityId,
    templateId: from.templateId,
    templateVersion: from.templateVersion,
    fromSnapshotId: snap.id,
    instanceId: admitted.id,
    idempotencyKey: r.key,
    requestHash: r.requestHash,
    ttlSeconds: ttl,
    maxTtlSeconds: from.maxTtlSeconds,
    warm: false,
  });
  w.audit({ targetId: r.id, tenantId: who.tenantId, details: { snapshotId: snap.id, from: from.id, instanceId: admitted.id, nodeId: snap.nodeId } });
  return sandbox;
}

/** The sandbox row, its deadline `ttlSeconds` from now, and the wake-up at that deadline. */
async function insertSandbox(w: Write, s: Omit<Sandbox, "expiresAt" | "createdAt">): Promise<Sandbox> {
  const expiresAt = new Date(w.now.getTime() + s.ttlSeconds * 1000);
  const [row] = await w.sql.query<Sandbox>(
    `INSERT INTO sandboxes AS s (id, tenant_id, owner_identity_id, template_id, template_version, from_snapshot_id, instance_id, idempotency_key,
       request_hash, ttl_seconds, max_ttl_seconds, expires_at, warm, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING ${SANDBOX_COLUMNS}`,
    [
      s.id,
      s.tenantId,
      s.ownerIdentityId,
      s.templateId,
      s.templateVersion,
      s.fromSnapshotId,
      s.instanceId,
      s.idempotencyKey,
      s.requestHash,
      s.ttlSeconds,
      s.maxTtlSeconds,
      expiresAt,
      s.warm,
      w.now,
    ],
  );
  w.deadline(s.id, expiresAt);
  return row as Sandbox;
}

/**
 * Take a paused, ready warm instance of the template's current version, if any: it becomes the sandbox's, the
 * tenant's quota is charged for it now, and it is asked to run — a change of its spec, which its host hears on
 * its open stream without waiting for a reconciler.
 */
async function claimWarm(w: Write, t: SandboxTemplate, who: Principal & { tenantId: string }, sbx: string): Promise<Instance | null> {
  const ready = `SELECT ${INSTANCE_COLUMNS}, (SELECT p.class FROM pools p WHERE p.id = instances.pool_id) AS "poolClass" FROM instances
      WHERE warm_template_id = $1 AND warm_template_version = $2 AND claimed_at IS NULL AND state = 'paused' AND desired_state = 'paused'
      ORDER BY created_at LIMIT 1`;
  // Skip what others hold, so concurrent claims spread over the pool; if all that is left is held (by another
  // claim, or a host report being applied), wait for one: after that claim commits the row no longer qualifies
  // (PostgreSQL re-checks it) and this create boots cold — a shared instance is impossible either way.
  const row =
    (await one<Instance & { poolClass: string }>(w.sql, `${ready} FOR UPDATE SKIP LOCKED`, [t.id, t.version])) ??
    (await one<Instance & { poolClass: string }>(w.sql, `${ready} FOR UPDATE`, [t.id, t.version]));
  if (!row) return null;
  const { poolClass, ...inst } = row;
  const charge = chargeOf(inst);
  const claimed = await writeChange(
    w,
    inst,
    { desired_state: "running", sandbox_id: sbx, claimed_at: w.now, owner_identity_id: who.identityId, charge, charge_released: false },
    "sandbox:claimed",
  );
  // A warm pool's class can pause (its template was checked for it), and so resume what it paused.
  const { power } = driverFor(poolClass);
  if (inst.nodeId && power) {
    await power.after(w, claimed, "running");
    // The host's answer wakes it; a reconcile pass before then would find nothing to do and hold the row it waits on.
    w.settle(inst.id);
  }
  // From now the allocation is the tenant's to pay for, not the operator's.
  if (claimed.allocationId) await handOverSpan(w, claimed.allocationId, spanOwner(claimed));
  // The quota row after the node's (the change above bumps its spec), as admission and deletion take them:
  // the other way round, a claim and an instance reaching `deleted` on that node deadlocked.
  await chargeQuota(w.sql, who.tenantId, charge);
  return claimed;
}

function bootCold(w: Write, deps: AdmissionDeps, t: SandboxTemplate, who: Principal & { tenantId: string }, sbx: string, key: string) {
  return admitInstance(
    w,
    deps,
    { identityId: who.identityId, tenantId: who.tenantId },
    { poolId: t.poolId, flavor: t.flavor, imageId: t.imageId, idempotencyKey: `sandbox:${key}` },
    { audit: false, sandbox: { sandboxId: sbx, env: envOf(t), networkPolicy: t.network } },
  );
}

/** Delete: its instance goes (the event's reason says why: `sandbox:deleted`, `sandbox:ttl`). Again: nothing. */
export async function deleteSandbox(w: Write, who: Principal, id: string, reason = "deleted"): Promise<Sandbox> {
  const s = await lockSandbox(w, who, id);
  const inst = await lockInstance(w, null, s.instanceId);
  if (inst.desiredState === "deleted") {
    w.unchanged();
    return s;
  }
  await writeChange(w, inst, { desired_state: "deleted" }, `sandbox:${reason}`);
  w.audit({ targetId: id, tenantId: s.tenantId, details: { reason } });
  return s;
}

/** A new deadline `ttlSeconds` from now, within the template's maximum lifetime counted from creation. */
export async function extendSandbox(w: Write, who: Principal, id: string, ttlSeconds: number): Promise<Sandbox> {
  const ttl = parseInput(z.number().int().min(1), ttlSeconds, "ttlSeconds");
  const s = await lockSandbox(w, who, id);
  const inst = await lockInstance(w, null, s.instanceId);
  if (inst.desiredState === "deleted") throw new AppError("PRECONDITION_FAILED", `sandbox ${id} is being deleted`);
  const expiresAt = new Date(w.now.getTime() + ttl * 1000);
  const latest = new Date(s.createdAt.getTime() + s.maxTtlSeconds * 1000);
  if (expiresAt > latest)
    throw new AppError("PRECONDITION_FAILED", `sandbox ${id} may live until ${latest.toISOString()} (maxTtlSeconds ${s.maxTtlSeconds})`, {
      latest: latest.toISOString(),
    });
  const [row] = await w.sql.query<Sandbox>(`UPDATE sandboxes s SET expires_at = $2 WHERE id = $1 RETURNING ${SANDBOX_COLUMNS}`, [id, expiresAt]);
  w.audit({ targetId: id, tenantId: s.tenantId, details: { expiresAt: expiresAt.toISOString() } });
  w.deadline(id, expiresAt);
  return row as Sandbox;
}

/** The sandbox's instance (visible to whoever may see the sandbox). */
export async function sandboxInstance(sql: Sql, s: Pick<Sandbox, "instanceId">): Promise<Instance> {
  return (await one<Instance>(sql, `SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = $1`, [s.instanceId])) as Instance;
}

export async function getSandbox(sql: Sql, who: Principal, id: string): Promise<Sandbox | null> {
  const s = await one<Sandbox>(sql, `SELECT ${SANDBOX_COLUMNS} FROM sandboxes s WHERE s.id = $1`, [id]);
  return s && visibleTo(who, s.tenantId) ? s : null;
}

/** Newest first, after `after` (a sandbox id) when given; the caller's tenant's, or all for operators. */
export async function listSandboxes(sql: Sql, who: Principal, opts: { templateId?: string | null; first: number; after?: string | null }): Promise<Sandbox[]> {
  return sql.query<Sandbox>(
    `SELECT ${SANDBOX_COLUMNS} FROM sandboxes s
      WHERE ($1::text IS NULL OR s.tenant_id = $1) AND ($2::text IS NULL OR s.template_id = $2)
        AND ($3::text IS NULL OR (s.created_at, s.id) < (SELECT created_at, id FROM sandboxes WHERE id = $3))
      ORDER BY s.created_at DESC, s.id DESC LIMIT $4`,
    [who.operator ? null : who.tenantId, opts.templateId ?? null, opts.after ?? null, opts.first],
  );
}

/** CREATING until its instance first runs, then its instance's state in sandbox words. */
export function sandboxState(instanceState: string): "CREATING" | "RUNNING" | "DELETING" | "DELETED" | "ERROR" {
  switch (instanceState) {
    case "running":
      return "RUNNING";
    case "deleting":
      return "DELETING";
    case "deleted":
      return "DELETED";
    case "error":
    case "lost":
    case "stopped":
      return "ERROR";
    default:
      return "CREATING";
  }
}
