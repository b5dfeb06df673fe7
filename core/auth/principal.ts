import { AppError, forbidden } from "../../contracts/errors.ts";
import type { Scope } from "./scopes.ts";

/** Who is calling, as established by a bearer token. */
export interface Principal {
  identityId: string;
  tenantId: string | null;
  operator: boolean;
  scopes: ReadonlySet<Scope>;
  /** Set for a host agent's node credential: it may read and report for this node only. */
  nodeId?: string;
  /** The revocable credential behind it (`tok:<id>`, `node:<id>`); absent for the bootstrap operator token. */
  credential?: { key: string; expiresAt: Date | null };
}

export function requireAuth(p: Principal | null): Principal {
  if (!p) throw new AppError("UNAUTHENTICATED", "a bearer token is required");
  return p;
}

/** A tenant principal holding `scope`; operators act on tenants' objects but do not hold tenant scopes. */
export function requireTenantScope(p: Principal | null, scope: Scope): Principal & { tenantId: string } {
  const who = requireAuth(p);
  if (who.tenantId === null) throw forbidden(`${scope} needs a tenant credential`);
  if (!who.scopes.has(scope)) throw forbidden(`token lacks scope ${scope}`);
  return who as Principal & { tenantId: string };
}

/** Read access: operators see everything, tenants what their scope allows within their tenant. */
export function requireRead(p: Principal | null, scope: Scope): Principal {
  const who = requireAuth(p);
  if (who.operator) return who;
  return requireTenantScope(who, scope);
}

/** Another tenant's object does not exist, as far as the caller can tell. */
export const visibleTo = (p: Principal, tenantId: string | null) => p.operator || (tenantId !== null && p.tenantId === tenantId);
