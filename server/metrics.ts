import type { DocumentNode } from "graphql";
import type { Plugin } from "graphql-yoga";
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { mirrorCounter } from "../infra/metrics.ts";
import type { Platform } from "../infra/platform.ts";
import { operationOf } from "./access.ts";
import type { LiveHub } from "./live/hub.ts";

/**
 * `/metrics` (Prometheus text format, prom-client): this server's GraphQL traffic, live connections and events,
 * and — read from the database at each scrape, so any replica shows the fleet — instances by state per pool and
 * each host's report age; then the platform's registry (infra/metrics.ts: the process, its writes, the job
 * queues' depth, and in one-process mode the worker's job timings).
 */
export function serverMetrics(platform: Platform, hub: LiveHub, liveOperations: () => number) {
  const registry = new Registry();
  const registers = [registry];

  const requests = new Counter({
    name: "bc_graphql_requests_total",
    help: "GraphQL operations executed, by operation name, type and outcome (ok, or the error code).",
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
      const { name: operation, type } = operationOf(args.document as DocumentNode, args.operationName) ?? { name: "anonymous", type: "query" };
      const stop = latency.startTimer({ operation, type });
      return {
        onExecuteDone: ({ result }) => {
          stop();
          const errors = "errors" in result ? result.errors : undefined;
          // Our errors carry their code on the original error until the response is masked.
          const first = errors?.[0] as { extensions?: { code?: unknown }; originalError?: { code?: unknown } } | undefined;
          const code = first?.extensions?.code ?? first?.originalError?.code;
          requests.inc({ operation, type, outcome: errors?.length ? String(code ?? "ERROR") : "ok" });
        },
      };
    },
  };

  // Two registries rendered one after the other rather than merged once: the worker may register its job
  // timings on the platform's after this server started (several servers may share one platform in tests).
  const render = async () => `${await registry.metrics()}${await platform.metrics.metrics()}`;
  return { registry, plugin, contentType: registry.contentType, render };
}
