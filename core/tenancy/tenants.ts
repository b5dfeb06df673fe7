import { randomBytes, timingSafeEqual } from "node:crypto";
import { z } from "zod";
import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import type { Tx } from "../../infra/db/prisma.ts";
import type { Principal } from "../auth/principal.ts";
import { isScope, type Scope, tenantScopes } from "../auth/scopes.ts";
import { gpuClaim, parseInput } from "../catalog/shapes.ts";
import { audit } from "../kernel/audit.ts";
import { prismaSql } from "../kernel/db.ts";
import { type IdSource, sha256Hex } from "../kernel/ids.ts";
import { nodeForCredential } from "../pools/hosted/hosts.ts";
import { ensureUsageRows, type QuotaInput, quotaRows, SCALAR_RESOURCES } from "./quota.ts";

const name = z
  .string()
  .trim()
  .regex(/^[A-Za-z0-9][A-Za-z0-9 ._-]{0,62}$/, "1 to 63 letters, digits, space . _ - (starting with a letter or digit)");
const limit = z.number().int().min(0).max(1_000_000_000).nullish();
const quota = z.object({
  instances: limit,
  vcpus: limit,
  memoryMib: limit,
  diskGib: limit,
  gpus: z.array(gpuClaim.extend({ count: z.number().int().min(0).max(1_000_000) })).nullish(),
});

export const OPERATOR_IDENTITY = "idn_operator";

interface Ctx {
  ids: IdSource;
  actor: string;
  now: Date;
  requestId?: string | null;
}

export async function createTenant(tx: Tx, ctx: Ctx, raw: { name: string; quota?: QuotaInput | null }) {
  const input = parseInput(z.object({ name, quota: quota.nullish() }), raw);
  if (await tx.tenant.findUnique({ where: { name: input.name }, select: { id: true } })) throw new AppError("CONFLICT", `tenant ${input.name} exists`);
  const tenant = await tx.tenant.create({ data: { id: ctx.ids("ten"), name: input.name, createdAt: ctx.now } });
  await ensureUsageRows(prismaSql(tx), tenant.id, SCALAR_RESOURCES);
  await setQuotaLimits(tx, tenant.id, input.quota ?? {});
  await audit(tx, { actorId: ctx.actor, tenantId: tenant.id, action: "createTenant", targetId: tenant.id, requestId: ctx.requestId, at: ctx.now });
  return tenant;
}

/** Replace a tenant's limits. Lowering a limit below what is in use is allowed: it only stops new charges. */
export async function setQuotaLimits(tx: Tx, tenantId: string, raw: QuotaInput) {
  const q = parseInput(quota, raw, "input.quota");
  await tx.quotaLimit.deleteMany({ where: { tenantId } });
  const rows = quotaRows(q);
  if (rows.length) await tx.quotaLimit.createMany({ data: rows.map((r) => ({ tenantId, resource: r.resource, limit: BigInt(r.limit) })) });
}

export async function quotaOf(tx: Tx, tenantId: string) {
  const [limits, usage] = await Promise.all([tx.quotaLimit.findMany({ where: { tenantId } }), tx.quotaUsage.findMany({ where: { tenantId } })]);
  const resources = [...new Set([...limits.map((l) => l.resource), ...usage.map((u) => u.resource)])].sort();
  return resources.map((resource) => ({
    resource,
    limit: limits.find((l) => l.resource === resource)?.limit ?? null,
    used: usage.find((u) => u.resource === resource)?.used ?? 0n,
  }));
}

const tokenInput = z.object({
  tenantId: z.string().min(1),
  name,
  scopes: z.array(z.string()).max(tenantScopes.length).nullish(),
  expiresAt: z.date().nullish(),
});

/** A new identity and its token. Only the token's SHA-256 is stored; the token is returned this once. */
export async function createApiToken(tx: Tx, ctx: Ctx, raw: z.input<typeof tokenInput>) {
  const input = parseInput(tokenInput, raw);
  const tenant = await tx.tenant.findUnique({ where: { id: input.tenantId }, select: { id: true } });
  if (!tenant) throw notFound("tenant", input.tenantId);
  const scopes = input.scopes ?? [...tenantScopes];
  const bad = scopes.find((s) => !isScope(s));
  if (bad) throw invalid(`unknown scope ${bad}; known: ${tenantScopes.join(", ")}`, { path: "input.scopes" });
  if (input.expiresAt && input.expiresAt <= ctx.now) throw invalid("expiresAt is in the past", { path: "input.expiresAt" });
  const identity = await tx.identity.create({ data: { id: ctx.ids("idn"), tenantId: tenant.id, name: input.name, createdAt: ctx.now } });
  const token = `bct_${randomBytes(32).toString("base64url")}`;
  const apiToken = await tx.apiToken.create({
    data: {
      id: ctx.ids("tok"),
      identityId: identity.id,
      name: input.name,
      tokenHash: sha256Hex(token),
      scopes: [...new Set(scopes)],
      createdAt: ctx.now,
      expiresAt: input.expiresAt ?? null,
    },
  });
  await audit(tx, { actorId: ctx.actor, tenantId: tenant.id, action: "createApiToken", targetId: apiToken.id, requestId: ctx.requestId, at: ctx.now });
  return { token, apiToken, identity };
}

export async function revokeApiToken(tx: Tx, ctx: Ctx, id: string) {
  const tok = await tx.apiToken.findUnique({ where: { id }, include: { identity: true } });
  if (!tok) throw notFound("API token", id);
  const revoked = tok.revokedAt ? tok : await tx.apiToken.update({ where: { id }, data: { revokedAt: ctx.now } });
  await audit(tx, { actorId: ctx.actor, tenantId: tok.identity.tenantId, action: "revokeApiToken", targetId: id, requestId: ctx.requestId, at: ctx.now });
  return revoked;
}

/** Who a bearer token speaks for, or null when it is unknown, expired or revoked. */
export async function authenticate(tx: Tx, bearer: string, operatorToken: string | undefined, now: Date): Promise<Principal | null> {
  if (operatorToken && constantTimeEqual(bearer, operatorToken)) {
    return { identityId: OPERATOR_IDENTITY, tenantId: null, operator: true, scopes: new Set<Scope>(tenantScopes) };
  }
  if (bearer.startsWith("bcn_")) {
    const nodeId = await nodeForCredential(prismaSql(tx), bearer);
    return nodeId
      ? { identityId: `node:${nodeId}`, tenantId: null, operator: false, scopes: new Set(), nodeId, credential: { key: `node:${nodeId}`, expiresAt: null } }
      : null;
  }
  const tok = await tx.apiToken.findUnique({ where: { tokenHash: sha256Hex(bearer) }, include: { identity: true } });
  if (!tok || tok.revokedAt || (tok.expiresAt && tok.expiresAt <= now)) return null;
  return {
    identityId: tok.identityId,
    tenantId: tok.identity.tenantId,
    operator: tok.identity.operator,
    scopes: new Set(tok.scopes.filter(isScope)),
    credential: { key: `tok:${tok.id}`, expiresAt: tok.expiresAt },
  };
}

function constantTimeEqual(a: string, b: string): boolean {
  const x = Buffer.from(sha256Hex(a), "hex");
  const y = Buffer.from(sha256Hex(b), "hex");
  return timingSafeEqual(x, y);
}

/** The bootstrap operator is an identity like any other, so audit rows and events can name it. */
export async function ensureOperatorIdentity(tx: Tx) {
  await tx.identity.upsert({ where: { id: OPERATOR_IDENTITY }, update: {}, create: { id: OPERATOR_IDENTITY, name: "operator", operator: true } });
}

export async function createProject(tx: Tx, ctx: Ctx, tenantId: string, raw: { name: string }) {
  const input = parseInput(z.object({ name }), raw);
  if (await tx.project.findUnique({ where: { tenantId_name: { tenantId, name: input.name } }, select: { id: true } })) {
    throw new AppError("CONFLICT", `project ${input.name} exists`);
  }
  const project = await tx.project.create({ data: { id: ctx.ids("prj"), tenantId, name: input.name, createdAt: ctx.now } });
  await audit(tx, { actorId: ctx.actor, tenantId, action: "createProject", targetId: project.id, requestId: ctx.requestId, at: ctx.now });
  return project;
}
