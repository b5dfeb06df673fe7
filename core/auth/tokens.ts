import { randomBytes } from "node:crypto";
import { z } from "zod";
import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import { one, type Sql } from "../kernel/db.ts";
import { sha256Hex } from "../kernel/ids.ts";
import { displayName, parseInput } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";
import { isScope, tenantScopes } from "./scopes.ts";

/** A credential's metadata; the token itself is shown once, at creation, and only its SHA-256 is kept. */
export interface ApiToken {
  id: string;
  identityId: string;
  name: string;
  scopes: string[];
  createdAt: Date;
  expiresAt: Date | null;
  revokedAt: Date | null;
}

const COLUMNS = `t.id, t.identity_id AS "identityId", t.name, t.scopes, t.created_at AS "createdAt", t.expires_at AS "expiresAt", t.revoked_at AS "revokedAt"`;

/** The bootstrap operator is an identity like any other, so audit rows and events can name it. */
export const OPERATOR_IDENTITY = "idn_operator";

export async function ensureOperatorIdentity(sql: Sql): Promise<void> {
  await sql.query(`INSERT INTO identities (id, name, operator) VALUES ($1, 'operator', true) ON CONFLICT (id) DO NOTHING`, [OPERATOR_IDENTITY]);
}

/** A new bootstrap operator token (the embedded quick start keeps one under its data dir). */
export const newOperatorToken = () => `bco_${randomBytes(24).toString("base64url")}`;

const tokenInput = z.object({
  tenantId: z.string().min(1),
  name: displayName,
  scopes: z.array(z.string()).max(tenantScopes.length).nullish(),
  expiresAt: z.date().nullish(),
});

/** A new identity of the tenant and its token. The token is returned this once. */
export async function createApiToken(w: Write, raw: z.input<typeof tokenInput>): Promise<{ token: string; apiToken: ApiToken }> {
  const input = parseInput(tokenInput, raw);
  const tenant = await one<{ deleting: boolean }>(w.sql, `SELECT deleted_at IS NOT NULL AS deleting FROM tenants WHERE id = $1 FOR SHARE`, [input.tenantId]);
  if (!tenant) throw notFound("tenant", input.tenantId);
  if (tenant.deleting) throw new AppError("PRECONDITION_FAILED", `tenant ${input.tenantId} is being deleted`);
  const scopes = input.scopes ?? [...tenantScopes];
  const bad = scopes.find((s) => !isScope(s));
  if (bad) throw invalid(`unknown scope ${bad}; known: ${tenantScopes.join(", ")}`, { path: "input.scopes" });
  if (input.expiresAt && input.expiresAt <= w.now) throw invalid("expiresAt is in the past", { path: "input.expiresAt" });
  const identityId = w.ids("idn");
  await w.sql.query(`INSERT INTO identities (id, tenant_id, name, created_at) VALUES ($1, $2, $3, $4)`, [identityId, input.tenantId, input.name, w.now]);
  const token = `bct_${randomBytes(32).toString("base64url")}`;
  const [apiToken] = await w.sql.query<ApiToken>(
    `INSERT INTO api_tokens AS t (id, identity_id, name, token_hash, scopes, created_at, expires_at)
     VALUES ($1, $2, $3, $4, $5::text[], $6, $7) RETURNING ${COLUMNS}`,
    [w.ids("tok"), identityId, input.name, sha256Hex(token), [...new Set(scopes)], w.now, input.expiresAt ?? null],
  );
  const created = apiToken as ApiToken;
  w.audit({ targetId: created.id, tenantId: input.tenantId, details: { identityId, scopes: created.scopes, expiresAt: created.expiresAt } });
  return { token, apiToken: created };
}

/** Revoke at once: the write announces the credential, so live connections made with it end. */
export async function revokeApiToken(w: Write, id: string): Promise<ApiToken> {
  const found = await one<ApiToken & { tenantId: string | null }>(
    w.sql,
    `SELECT ${COLUMNS}, i.tenant_id AS "tenantId" FROM api_tokens t JOIN identities i ON i.id = t.identity_id WHERE t.id = $1 FOR UPDATE OF t`,
    [id],
  );
  if (!found) throw notFound("API token", id);
  const { tenantId, ...token } = found;
  // Announced again even when already revoked: a connection that missed the first message is closed now.
  w.revoke(`tok:${id}`);
  if (token.revokedAt) {
    w.unchanged();
    return token;
  }
  const revoked = await one<ApiToken>(w.sql, `UPDATE api_tokens t SET revoked_at = $2 WHERE t.id = $1 RETURNING ${COLUMNS}`, [id, w.now]);
  w.audit({ targetId: id, tenantId });
  return revoked as ApiToken;
}
