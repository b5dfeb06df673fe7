/**
 * Tenant scopes. An API token carries a subset; operators hold every scope and the operator-only actions
 * (tenants, tokens, pools, nodes, flavors) are checked separately, never by scope.
 */
export const tenantScopes = [
  "compute:instances:read",
  "compute:instances:create",
  "compute:instances:update",
  "compute:instances:delete",
  "compute:images:read",
  "compute:images:write",
  "compute:projects:read",
  "compute:projects:write",
  "compute:pools:read",
  "compute:sandboxes:read",
  "compute:sandboxes:write",
  "compute:sandboxes:exec",
  "compute:usage:read",
] as const;
export type Scope = (typeof tenantScopes)[number];

export const isScope = (s: string): s is Scope => (tenantScopes as readonly string[]).includes(s);
