import { readdirSync, readFileSync } from "node:fs";
import { type DocumentNode, type GraphQLSchema, Kind, parse } from "graphql";
import type { Plugin } from "graphql-yoga";
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { errorCodes } from "../contracts/errors.ts";
import { mirrorCounter } from "../infra/metrics.ts";
import type { Platform } from "../infra/platform.ts";
import { operationOf } from "./access.ts";
import type { LiveHub } from "./live/hub.ts";

/**
 * Label values never come from what a client chooses: every value is a series kept for good, so a client naming
 * each request differently would grow the page without bound. An operation is labelled by its name only when the
 * name is known for its type — an operation of the SDK's own documents (sdk/operations, read at start as data:
 * the server imports nothing of the SDK) or a root field of the schema (`query instances { … }`) — and as "other"
 * otherwise; an outcome is ok, one of the error codes, or ERROR. Pools, nodes and jobs are the operator's, and
 * close codes the server's own.
 */
export const OTHER_OPERATION = "other";
const OUTCOMES = new Set<string>([...errorCodes, "INTERNAL"]);

/** The SDK's operations, name → type, from its documents (none, with a warning, where they were not shipped). */
export function sdkOperations(dir = new URL("../sdk/operations/", import.meta.url)): Map<string, string> {
  const known = new Map<string, string>();
  for (const file of readdirSync(dir).filter((f) => f.endsWith(".graphql")))
    for (const def of parse(readFileSync(new URL(file, dir), "utf8")).definitions)
      if (def.kind === Kind.OPERATION_DEFINITION && def.name) known.set(def.name.value, def.operation);
  return known;
}

/** The schema's root fields, name → type. */
function rootFields(schema: GraphQLSchema): Map<string, string> {
  const known = new Map<string, string>();
  for (const [type, root] of [
    ["query", schema.getQueryType()],
    ["mutation", schema.getMutationType()],
    ["subscription", schema.getSubscriptionType()],
  ] as const)
    for (const name of Object.keys(root?.getFields() ?? {})) known.set(name, type);
  return known;
}

/**
 * `/metrics` (Prometheus text format, prom-client): this server's GraphQL traffic, live connections and events,
 * and — read from the database at each scrape, so any replica shows the fleet — instances by state per pool and
 * each host's report age; then the platform's registry (infra/metrics.ts: the process, its writes, the job
 * queues' depth, and in one-process mode the worker's job timings).
 */
export function serverMetrics(platform: Platform, hub: LiveHub, liveOperations: () => number) {
  const registry = new Registry();
  let sdk: Map<string, string>;
  try {
    sdk = sdkOperations();
  } catch (e) {
    platform.log.warn("the SDK's operations could not be read: their names are counted as other", { err: String(e) });
    sdk = new Map();
  }
  const roots = new WeakMap<GraphQLSchema, Map<string, string>>();
  /** The name a series may carry for this operation. */
  const labelOf = (schema: GraphQLSchema, name: string, type: string) => {
    if (name === "anonymous" || sdk.get(name) === type) return name;
    const fields = roots.get(schema) ?? rootFields(schema);
    roots.set(schema, fields);
    return fields.get(name) === type ? name : OTHER_OPERATION;
  };
  const registers = [registry];

  const requests = new Counter({
    name: "bc_graphql_requests_total",
    help: "GraphQL operations executed, by operation name (other: a name not the SDK's nor a root field's), type and outcome (ok, or the error code).",
    labelNames: ["operation", "type", "outcome"],
    registers,
  });
  const latency = new Histogram({
    name: "bc_graphql_request_duration_seconds",
    help: "Time to execute a GraphQL query or mutation, by operation name and type.",
    labelNames: ["operation", "type"],
    buckets: [0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers,
  });
  const mirror = mirrorCounter(registers);
  const gauge = (name: string, help: string, value: () => number) =>
    new Gauge({
      name,
      help,
      registers,
      collect() {
        this.set(value());
      },
    });
  gauge("bc_live_connections", "Open websocket connections.", () => hub.connections.size);
  gauge("bc_live_subscriptions", "Active subscriptions on those connections.", () => hub.subscriptions());
  gauge("bc_live_operations", "Subscription sources open (shared sources count once).", liveOperations);
  mirror("bc_live_events_delivered_total", "Instance events handed to this server's subscribers.", () => hub.feed.delivered);
  mirror(
    "bc_live_events_read_total",
    "Events this server's live feed read from the table to deliver them (its own writes' events need no read).",
    () => hub.feed.readBack,
  );
  new Counter({
    name: "bc_live_closed_total",
    help: "Connections this server closed, by close code.",
    labelNames: ["code"],
    registers,
    collect() {
      this.reset();
      for (const [code, n] of hub.closedBy) this.inc({ code: String(code) }, n);
    },
  });
  new Gauge({
    name: "bc_instances",
    help: "Instances that are not deleted, by pool and state.",
    labelNames: ["pool", "state"],
    registers,
    async collect() {
      const rows = await platform.read((sql) =>
        sql.query<{ pool: string; state: string; n: number }>(
          `SELECT pool_id AS pool, state, count(*)::int AS n FROM instances WHERE state <> 'deleted' GROUP BY 1, 2`,
        ),
      );
      this.reset();
      for (const r of rows) this.set({ pool: r.pool, state: r.state }, r.n);
    },
  });
  new Gauge({
    name: "bc_host_report_age_seconds",
    help: "Seconds since each host's last report (hosts that never reported are left out).",
    labelNames: ["pool", "node"],
    registers,
    async collect() {
      const rows = await platform.read((sql) =>
        sql.query<{ pool: string; node: string; at: Date }>(
          `SELECT pool_id AS pool, name AS node, last_report_at AS at FROM nodes WHERE gone_at IS NULL AND last_report_at IS NOT NULL`,
        ),
      );
      this.reset();
      const now = platform.now().getTime();
      for (const r of rows) this.set({ pool: r.pool, node: r.node }, Math.max(0, (now - r.at.getTime()) / 1000));
    },
  });
  /** Counts and times each query and mutation (subscriptions are the live gauges' business). */
  const plugin: Plugin = {
    onExecute: ({ args }) => {
      const { name, type } = operationOf(args.document as DocumentNode, args.operationName) ?? { name: "anonymous", type: "query" };
      const operation = labelOf(args.schema, name, type);
      const stop = latency.startTimer({ operation, type });
      return {
        onExecuteDone: ({ result }) => {
          stop();
          const errors = "errors" in result ? result.errors : undefined;
          // Our errors carry their code on the original error until the response is masked.
          const first = errors?.[0] as { extensions?: { code?: unknown }; originalError?: { code?: unknown } } | undefined;
          const code = String(first?.extensions?.code ?? first?.originalError?.code);
          requests.inc({ operation, type, outcome: errors?.length ? (OUTCOMES.has(code) ? code : "ERROR") : "ok" });
        },
      };
    },
  };

  // Two registries rendered one after the other rather than merged once: the worker may register its job
  // timings on the platform's after this server started (several servers may share one platform in tests).
  const render = async () => `${await registry.metrics()}${await platform.metrics.metrics()}`;
  return { registry, plugin, contentType: registry.contentType, render };
}
