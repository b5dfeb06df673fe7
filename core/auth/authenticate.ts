import { timingSafeEqual } from "node:crypto";
import { one, type Sql } from "../kernel/db.ts";
import { sha256Hex } from "../kernel/ids.ts";
import type { Principal } from "./principal.ts";
import { isScope, type Scope, tenantScopes } from "./scopes.ts";
import { OPERATOR_IDENTITY } from "./tokens.ts";

/**
 * Who a bearer token speaks for, or null when it is unknown, expired or revoked. Three kinds: the bootstrap
 * operator token (configuration), a node credential (`bcn_…`, a host agent acting for its node) and API tokens.
 */
export async function authenticate(sql: Sql, bearer: string, operatorToken: string | undefined, now: Date): Promise<Principal | null> {
  if (isOperatorToken(bearer, operatorToken)) {
    return { identityId: OPERATOR_IDENTITY, tenantId: null, operator: true, scopes: new Set<Scope>(tenantScopes) };
  }
  if (bearer.startsWith("bcn_")) {
    const node = await one<{ id: string }>(sql, `SELECT id FROM nodes WHERE credential_hash = $1 AND gone_at IS NULL`, [sha256Hex(bearer)]);
    return node
      ? {
          identityId: `node:${node.id}`,
          tenantId: null,
          operator: false,
          scopes: new Set(),
          nodeId: node.id,
          credential: { key: `node:${node.id}`, expiresAt: null },
        }
      : null;
  }
  const tok = await one<{
    id: string;
    identityId: string;
    tenantId: string | null;
    operator: boolean;
    scopes: string[];
    expiresAt: Date | null;
    revokedAt: Date | null;
  }>(
    sql,
    `SELECT t.id, t.identity_id AS "identityId", i.tenant_id AS "tenantId", i.operator, t.scopes, t.expires_at AS "expiresAt", t.revoked_at AS "revokedAt"
       FROM api_tokens t JOIN identities i ON i.id = t.identity_id WHERE t.token_hash = $1`,
    [sha256Hex(bearer)],
  );
  if (!tok || tok.revokedAt || (tok.expiresAt && tok.expiresAt <= now)) return null;
  return {
    identityId: tok.identityId,
    tenantId: tok.tenantId,
    operator: tok.operator,
    scopes: new Set(tok.scopes.filter(isScope)),
    credential: { key: `tok:${tok.id}`, expiresAt: tok.expiresAt },
  };
}

/** Whether `bearer` is the bootstrap operator token (compared in constant time). */
export function isOperatorToken(bearer: string, operatorToken: string | undefined): boolean {
  return !!operatorToken && constantTimeEqual(bearer, operatorToken);
}

function constantTimeEqual(a: string, b: string): boolean {
  return timingSafeEqual(Buffer.from(sha256Hex(a), "hex"), Buffer.from(sha256Hex(b), "hex"));
}
