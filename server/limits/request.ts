import type { IncomingMessage } from "node:http";
import { createComplexityRule } from "@pothos/plugin-complexity";
import {
  type DocumentNode,
  type ExecutionArgs,
  GraphQLError,
  type GraphQLSchema,
  getOperationAST,
  Kind,
  type SelectionSetNode,
  TypeInfo,
  validate,
  visit,
  visitWithTypeInfo,
} from "graphql";
import type { Plugin } from "graphql-yoga";
import type { Principal } from "../../core/auth/principal.ts";
import type { Platform } from "../../infra/platform.ts";
import type { Context } from "../context.ts";
import { onceFor } from "../memo.ts";
import { limitError } from "./document.ts";
import type { Rates } from "./rates.ts";

/** The one operation an agent sends before it has a node credential: it is host work too. */
const HOST_FIELDS = new Set(["joinNode"]);
/** Budget points a request spends: 1, and 1 more per 1,000 of its cost. */
export const COST_PER_POINT = 1000;
export const pointsFor = (cost: number) => 1 + Math.floor(cost / COST_PER_POINT);

type RequestContext = Context & { req?: IncomingMessage; request?: Request };

/** An operation let through: what it costs, whose budget it spent (null: a host's), and the lane it runs on. */
export interface Admitted {
  cost: number;
  caller: string | null;
  platform: Platform;
}

/**
 * The checks every operation passes before it runs, over HTTP and websockets, subscriptions included: mutations
 * per request, the cost budget, and the caller's rate (1 point, and 1 more per 1,000 of cost). Null when the
 * document holds no single operation to run (execution itself says why).
 */
export async function admitOperation(platform: Platform, rates: Rates, args: ExecutionArgs, http: boolean): Promise<GraphQLError | Admitted | null> {
  const { limits } = platform.config;
  const ctx = args.contextValue as RequestContext;
  const op = getOperationAST(args.document, args.operationName);
  if (!op) return null;
  const fields = rootFields(args.document, op.selectionSet).filter((f) => !f.startsWith("__"));
  if (op.operation === "mutation" && fields.length > limits.mutations) {
    return limitError(`${fields.length} mutations in one request; at most ${limits.mutations}`, "mutations");
  }
  const cost = costOf(args);
  if (cost > limits.cost) {
    return limitError(`this request costs ${cost}, over the budget of ${limits.cost}: ask for fewer items (first) or fewer fields`, "cost");
  }
  // Host credentials answer to no tenant's budget: their traffic is what the platform runs on.
  if (ctx.principal?.nodeId) return { cost, caller: null, platform };
  const caller = callerOf(ctx);
  const over = await rates.take(caller, pointsFor(cost));
  if (over) return rateLimited(over.retryAfterMs, limits, http);
  if (!ctx.principal && fields.every((f) => HOST_FIELDS.has(f))) return { cost, caller: null, platform };
  return { cost, caller, platform: platform.api(caller) };
}

/**
 * Limits that depend on the request as it will run — its variables and who sends it — checked just before
 * execution (admitOperation). Then the request's database work is put in its lane: host work as it is,
 * everything else as its caller's share of the API lane (infra/db/lanes.ts). Subscriptions do not pass through
 * here (they skip the executor: server/live/execute.ts); server/limits/live.ts admits them the same way.
 */
export function requestLimits(platform: Platform, rates: Rates): Plugin<RequestContext> {
  return {
    onExecute: async ({ args, extendContext, setResultAndStopExecution }) => {
      const admitted = await admitOperation(platform, rates, args, Boolean(args.contextValue.request));
      if (admitted instanceof GraphQLError) {
        holdRefused(args.contextValue, admitted);
        return setResultAndStopExecution({ errors: [admitted] });
      }
      if (admitted && admitted.platform !== platform) extendContext({ platform: admitted.platform });
    },
  };
}

/** Over a websocket, a request refused for its rate leaves its socket unread until it may ask again (LiveConnection.hold). */
export function holdRefused(ctx: Context, error: GraphQLError): void {
  const retryAfterMs = error.extensions?.retryAfterMs;
  if (error.extensions?.code === "RATE_LIMITED" && typeof retryAfterMs === "number") ctx.live?.conn.hold(retryAfterMs);
}

/** Whose budget a request spends: its credential's, the bootstrap operator's, or (anonymous) its address's. */
export function callerOf(ctx: RequestContext): string {
  return callerKey(ctx.principal, ctx.req?.socket.remoteAddress);
}

export function callerKey(p: Principal | null | undefined, address: string | undefined): string {
  if (p) return p.credential?.key ?? `identity:${p.identityId}`;
  return `addr:${address ?? "unknown"}`;
}

export function rateLimited(retryAfterMs: number, limits: Platform["config"]["limits"], http: boolean): GraphQLError {
  const seconds = Math.ceil(retryAfterMs / 1000);
  return new GraphQLError(
    `rate limited: this credential spent its ${limits.ratePoints} points of ${limits.rateWindowSeconds} s (a request costs 1 point, and 1 more per ${COST_PER_POINT} of its cost); retry in ${seconds} s (the server's limits.ratePoints)`,
    {
      extensions: {
        code: "RATE_LIMITED",
        retryAfterMs,
        ...(http ? { http: { status: 429, headers: { "Retry-After": String(seconds) } } } : {}),
      },
    },
  );
}

/**
 * Costs worked out already, per parsed document (yoga's parser cache hands the same one out again for the same
 * text) and operation. A cost reads the variables only through the arguments of fields whose cost is a function
 * of them (`first`), so requests that differ only elsewhere (each create's input) share one entry.
 */
const costs = new WeakMap<object, Map<string, { variables: string[]; byValues: Map<string, number> }>>();
/** Distinct values of those variables remembered per operation; past this, costs are worked out each time. */
const COSTS_PER_OPERATION = 256;

/** The operation's cost with its variables (server/schema/builder.ts says what each field costs). */
function costOf(args: ExecutionArgs): number {
  const known = onceFor(costs, args.document, args.operationName ?? "", () => ({
    variables: costVariables(args.schema, args.document),
    byValues: new Map<string, number>(),
  }));
  const values = (args.variableValues ?? {}) as Record<string, unknown>;
  const key = JSON.stringify(known.variables.map((v) => values[v] ?? null));
  const cached = known.byValues.get(key);
  if (cached !== undefined) return cached;
  let cost = 0;
  const rule = createComplexityRule({
    context: args.contextValue as object,
    variableValues: values,
    operationName: args.operationName,
    onResult: (r) => {
      cost = Math.max(cost, r.complexity);
    },
  });
  // Variables that do not fit report errors here and leave the cost at 0: execution refuses them itself. That 0
  // belongs to this request alone, so it is not remembered.
  const errors = validate(args.schema, args.document, [rule]);
  if (errors.length === 0 && known.byValues.size < COSTS_PER_OPERATION) known.byValues.set(key, cost);
  return cost;
}

/** The variables a document gives to arguments of fields whose cost is a function of their arguments. */
function costVariables(schema: GraphQLSchema, document: DocumentNode): string[] {
  const names = new Set<string>();
  const types = new TypeInfo(schema);
  visit(
    document,
    visitWithTypeInfo(types, {
      Variable(node) {
        // Directives' arguments and variable definitions are not read by the cost; an unknown field fails validation.
        if (types.getDirective() || !types.getArgument()) return;
        const field = types.getFieldDef();
        if (!field || typeof field.extensions?.complexity === "function") names.add(node.name.value);
      },
    }),
  );
  return [...names].sort();
}

/** The root fields an operation selects, through its fragments. */
function rootFields(document: DocumentNode, set: SelectionSetNode, seen = new Set<string>()): string[] {
  const names: string[] = [];
  for (const s of set.selections) {
    if (s.kind === Kind.FIELD) names.push(s.name.value);
    else if (s.kind === Kind.INLINE_FRAGMENT) names.push(...rootFields(document, s.selectionSet, seen));
    else if (!seen.has(s.name.value)) {
      seen.add(s.name.value);
      const fragment = document.definitions.find((d) => d.kind === Kind.FRAGMENT_DEFINITION && d.name.value === s.name.value);
      if (fragment?.kind === Kind.FRAGMENT_DEFINITION) names.push(...rootFields(document, fragment.selectionSet, seen));
    }
  }
  return names;
}
