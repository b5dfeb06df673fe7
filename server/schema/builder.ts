import SchemaBuilder from "@pothos/core";
import ComplexityPlugin from "@pothos/plugin-complexity";
import ScopeAuthPlugin, { type AuthFailure, AuthScopeFailureType } from "@pothos/plugin-scope-auth";
import { GraphQLError, type GraphQLResolveInfo, Kind } from "graphql";
import { AppError, forbidden } from "../../contracts/errors.ts";
import type { Principal } from "../../core/auth/principal.ts";
import type { Scope } from "../../core/auth/scopes.ts";
import type { Context } from "../context.ts";

/** A field's context once its authScopes let the caller in: the principal is there, with what the scope promised. */
export type Admitted<Extra = unknown> = Context & { principal: Principal & Extra };

export const builder = new SchemaBuilder<{
  Context: Context;
  DefaultFieldNullability: false;
  Scalars: {
    DateTime: { Input: Date; Output: Date };
    JSON: { Input: unknown; Output: unknown };
  };
  /** Who may call a field, declared on it (`t.withAuth({ … })`); several scopes in one declaration are alternatives. */
  AuthScopes: {
    /** Anyone: the field checks a credential of its own (joinNode's join token). */
    public: boolean;
    /** Any credential: an API token, the operator's, a host's. */
    authenticated: boolean;
    operator: boolean;
    /** A host agent's node credential. */
    node: boolean;
    /** A tenant's token holding this scope. Operators hold none: `{ operator: true, tenantScope: … }` admits both. */
    tenantScope: Scope;
  };
  AuthContexts: {
    authenticated: Admitted;
    operator: Admitted;
    node: Admitted<{ nodeId: string }>;
    tenantScope: Admitted<{ tenantId: string }>;
  };
}>({
  defaultFieldNullability: false,
  plugins: [ScopeAuthPlugin, ComplexityPlugin],
  scopeAuth: {
    // A subscription's scopes are checked once, before its subscribe function runs (a refusal is the
    // subscription's error), not again for each event.
    authorizeOnSubscribe: true,
    authScopes: ({ principal: p }) => ({
      public: true,
      authenticated: p !== null,
      operator: p?.operator === true,
      node: !!p?.nodeId,
      tenantScope: (scope) => p !== null && p.tenantId !== null && p.scopes.has(scope),
    }),
    unauthorizedError: (_parent, ctx, info, { failure }) => refusal(ctx.principal, failure, info),
  },
  // Each field's cost, for the budget of server/limits/: 1, and a list's items count as many times as it holds
  // (10 unless the field says, as a page does with `first`). The budget is checked before execution, with the
  // request's variables, so the plugin's own check while resolving is off.
  complexity: { defaultComplexity: 1, defaultListMultiplier: 10, disabled: true },
});

/**
 * What a caller a field's scopes refused is told: UNAUTHENTICATED without a credential, FORBIDDEN naming what the
 * field needs otherwise. Whether a given object is the caller's is not asked here: another tenant's object is
 * NOT_FOUND, from core/.
 */
function refusal(p: Principal | null, failure: AuthFailure, info: GraphQLResolveInfo): AppError {
  if (!p) return new AppError("UNAUTHENTICATED", "a bearer token is required");
  return forbidden(`${info.parentType.name}.${info.fieldName} needs ${needs(failure).join(" or ") || "another credential"}`);
}

function needs(f: AuthFailure): string[] {
  if (f.kind === AuthScopeFailureType.AnyAuthScopes || f.kind === AuthScopeFailureType.AllAuthScopes) return f.failures.flatMap(needs);
  if (f.kind !== AuthScopeFailureType.AuthScope) return [];
  if (f.scope === "tenantScope") return [`a tenant's token with scope ${String(f.parameter)}`];
  return [{ operator: "an operator", node: "a node credential", authenticated: "a credential" }[f.scope] ?? f.scope];
}

builder.queryType({});
builder.mutationType({});
builder.subscriptionType({});

/**
 * RFC 3339 with a four-digit year, as `toISOString` writes it. Wider forms (`+099999-01-01T…`) are valid for
 * JavaScript but not for PostgreSQL's drivers on the way back, and a value that cannot be read back must not be
 * written: it is refused here, before anything runs. So is a date that does not exist (February 30th, hour 24,
 * month 13), which `Date` would roll over into another without a word.
 */
const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::(\d{2})(\.\d{1,9})?)?(?:Z|[+-](\d{2}):(\d{2}))$/i;

const daysIn = (year: number, month: number) =>
  month === 2 ? (year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0) ? 29 : 28) : [4, 6, 9, 11].includes(month) ? 30 : 31;

/** Each part within its range: the day in its month, the hour below 24, no leap second (Date has none). */
function exists(m: RegExpExecArray): boolean {
  const n = (i: number) => Number(m[i] ?? 0);
  const [year, month, day] = [n(1), n(2), n(3)];
  return year >= 1 && month >= 1 && month <= 12 && day >= 1 && day <= daysIn(year, month) && n(4) <= 23 && n(5) <= 59 && n(6) <= 59 && n(8) <= 23 && n(9) <= 59;
}

export function parseDateTime(v: unknown): Date {
  const m = typeof v === "string" ? RFC3339.exec(v) : null;
  const d = m && exists(m) ? new Date(v as string) : null;
  const year = d?.getUTCFullYear() ?? Number.NaN;
  if (!d || !(year >= 1 && year <= 9999)) {
    throw new GraphQLError("DateTime must be an RFC 3339 string of a date that exists, in the years 0001 to 9999, like 2030-01-01T00:00:00Z", {
      extensions: { code: "INVALID_INPUT" },
    });
  }
  return d;
}

builder.scalarType("DateTime", {
  description: "An instant, as an RFC 3339 string (years 0001 to 9999), written in UTC.",
  serialize: (d) => (d instanceof Date ? d.toISOString() : String(d)),
  parseValue: parseDateTime,
  parseLiteral: (ast) => parseDateTime(ast.kind === Kind.STRING ? ast.value : null),
});

builder.scalarType("JSON", {
  description: "Any JSON value.",
  serialize: (v) => v,
  parseValue: (v) => v,
});

/** Resources by GPU model, used by flavors, quota and node capacity. */
export const GpuCount = builder.objectRef<{ model: string; count: number }>("GpuCount").implement({
  fields: (t) => ({ model: t.exposeString("model"), count: t.exposeInt("count") }),
});

export const GpuCountInput = builder.inputType("GpuCountInput", {
  fields: (t) => ({ model: t.string({ required: true }), count: t.int({ required: true }) }),
});

export const Resources = builder
  .objectRef<{ vcpus: number; memoryMib: number; diskGib: number; gpus: { model: string; count: number }[] }>("Resources")
  .implement({
    fields: (t) => ({
      vcpus: t.exposeInt("vcpus"),
      memoryMib: t.exposeInt("memoryMib"),
      diskGib: t.exposeInt("diskGib"),
      gpus: t.field({ type: [GpuCount], resolve: (r) => r.gpus }),
    }),
  });
