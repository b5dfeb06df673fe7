import parsePrometheusTextFormat from "parse-prometheus-text-format";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateInstanceDocument, DeleteInstanceDocument, InstanceDocument } from "../../sdk/client.ts";
import { until } from "../support/fixtures.ts";
import { expectCode } from "../support/harness.ts";
import { type Hosts, startHosts } from "../support/hosts.ts";
import { EVENT_FIELDS, watcher } from "../support/live.ts";

/**
 * `/metrics` after a little churn on simulated hosts: it parses as Prometheus text, the counters move between
 * two scrapes, and the fleet gauges (instances by state, host report age, job queues) say what is true.
 */
let hosts: Hosts;

beforeAll(async () => {
  hosts = await startHosts(1);
  await hosts.start(0);
});
afterAll(() => hosts?.close());

type Family = { name: string; type: string; metrics: { labels?: Record<string, string>; value?: string; buckets?: Record<string, string>; count?: string }[] };
let lastText = "";
const scrape = async () => {
  const res = await fetch(hosts.h.url.replace(/\/graphql$/, "/metrics"));
  expect(res.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
  lastText = await res.text();
  return new Map((parsePrometheusTextFormat(lastText) as Family[]).map((f) => [f.name, f]));
};
/** A labelled histogram's count, from the last scrape's text (the parser keeps only its buckets). */
const count = (name: string, labels: Record<string, string>) => {
  const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  return [...lastText.matchAll(new RegExp(`^${name}_count\\{([^}]*)\\} (\\S+)$`, "gm"))]
    .filter((m) => want.every((w) => (m[1] as string).split(",").includes(w)))
    .reduce((sum, m) => sum + Number(m[2]), 0);
};
const value = (m: Map<string, Family>, name: string, labels: Record<string, string> = {}) =>
  (m.get(name)?.metrics ?? [])
    .filter((x) => Object.entries(labels).every(([k, v]) => x.labels?.[k] === v))
    .reduce((sum, x) => sum + Number(x.value ?? x.count ?? 0), 0);

describe("/readyz", () => {
  it("is ready with the database migrated and the bus answering, and says which migration is missing otherwise", async () => {
    const readyz = async () => {
      const res = await fetch(hosts.h.url.replace(/\/graphql$/, "/readyz"));
      return { status: res.status, body: (await res.json()) as Record<string, unknown> };
    };
    expect(await readyz()).toEqual({ status: 200, body: { ready: true, database: "ok", bus: "ok" } });
    const sql = (text: string) => hosts.h.platform.db.prisma.$executeRawUnsafe(text);
    const [last] = await hosts.h.platform.db.prisma.$queryRawUnsafe<{ name: string }[]>(
      `SELECT migration_name AS name FROM "_prisma_migrations" ORDER BY migration_name DESC LIMIT 1`,
    );
    await sql(`UPDATE "_prisma_migrations" SET rolled_back_at = now() WHERE migration_name = '${last?.name}'`);
    try {
      expect(await readyz()).toEqual({ status: 503, body: { ready: false, database: `migrations not applied: ${last?.name}`, bus: "ok" } });
    } finally {
      await sql(`UPDATE "_prisma_migrations" SET rolled_back_at = NULL WHERE migration_name = '${last?.name}'`);
    }
    expect((await readyz()).status).toBe(200);
  });
});

describe("/metrics", () => {
  it("parses as Prometheus text and moves with the churn: requests, latency, events, connections, instances, hosts, jobs", async () => {
    const before = await scrape();
    const t = await hosts.h.tenant();
    const live = watcher(hosts.h.url, t.token, `subscription { instanceEvents { ${EVENT_FIELDS} } }`, {});
    await until("the subscription open", () => live.socket !== null);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++)
      ids.push(
        (await t.client.request(CreateInstanceDocument, { input: { poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId } })).createInstance.id,
      );
    for (const id of ids) await until(`${id} running`, async () => (await t.client.request(InstanceDocument, { id })).instance?.state === "RUNNING");
    await expectCode(t.client.request(DeleteInstanceDocument, { id: "inst_nope" }), "NOT_FOUND");
    await t.client.request(DeleteInstanceDocument, { id: ids[0] as string });
    await until("the first deleted", async () => (await t.client.request(InstanceDocument, { id: ids[0] as string })).instance?.state === "DELETED");
    await until("events delivered", () => live.events.length >= 10);

    const after = await scrape();
    expect(value(after, "bc_graphql_requests_total", { operation: "CreateInstance", type: "mutation", outcome: "ok" })).toBe(
      value(before, "bc_graphql_requests_total", { operation: "CreateInstance", type: "mutation", outcome: "ok" }) + 3,
    );
    expect(value(after, "bc_graphql_requests_total", { operation: "DeleteInstance", outcome: "NOT_FOUND" })).toBe(1);
    // The parser keeps a labelled histogram's buckets only: its count is read from the text itself.
    expect(after.get("bc_graphql_request_duration_seconds")?.type).toBe("HISTOGRAM");
    expect(lastText).toMatch(/^bc_graphql_request_duration_seconds_count\{operation="CreateInstance",type="mutation"\} 3$/m);
    expect(value(after, "bc_events_published_total")).toBeGreaterThan(value(before, "bc_events_published_total"));
    expect(value(after, "bc_live_events_delivered_total")).toBeGreaterThanOrEqual(value(before, "bc_live_events_delivered_total") + 10);
    expect(value(after, "bc_live_connections")).toBeGreaterThanOrEqual(1);
    expect(value(after, "bc_instances", { pool: hosts.poolId, state: "running" })).toBe(2);
    expect(after.get("bc_host_report_age_seconds")?.metrics.map((m) => m.labels?.node)).toEqual(["host-1"]);
    expect(value(after, "bc_host_report_age_seconds")).toBeLessThan(10);
    expect(after.get("bc_jobs")?.metrics.some((m) => m.labels?.job === "vps.instances")).toBe(true);
    // The worker shares the platform's registry in one process, so its job timings are on this same page.
    expect(after.get("bc_job_wait_seconds")?.type).toBe("HISTOGRAM");
    expect(after.get("bc_job_duration_seconds")?.type).toBe("HISTOGRAM");
    expect(count("bc_job_wait_seconds", { job: "vps.instances" })).toBeGreaterThan(0);
    expect(count("bc_job_duration_seconds", { job: "vps.instances", outcome: "ok" })).toBeGreaterThan(0);
    expect(count("bc_job_duration_seconds", { job: "vps.sweep", outcome: "ok" })).toBeGreaterThan(0);
    expect(value(after, "process_resident_memory_bytes")).toBeGreaterThan(0);
    await live.dispose();
  });
});
