import parsePrometheusTextFormat from "parse-prometheus-text-format";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateApiTokenDocument, CreateInstanceDocument, CreateTenantDocument, StopInstanceDocument } from "../../sdk/client.ts";
import { until } from "../support/fixtures.ts";
import { waitForState } from "../support/hosts.ts";
import { type Cluster, startCluster } from "./processes.ts";

/**
 * `bc worker` as a process of its own serves /metrics on METRICS_PORT (0: a free port, printed): its job timings,
 * queue depth, writes and process figures, scraped after an instance was stopped through it.
 */
let c: Cluster;
beforeAll(async () => {
  c = await startCluster({ hosts: 1, env: { METRICS_PORT: "0" } });
});
afterAll(async () => {
  const errors = c?.errors() ?? [];
  if (errors.length) console.error(`process errors:\n${errors.slice(0, 20).join("\n")}`);
  await c?.close();
});

/** A labelled histogram's count, from the text (the parser keeps only its buckets). */
const count = (text: string, name: string, label: string) =>
  [...text.matchAll(new RegExp(`^${name}_count\\{([^}]*)\\} (\\S+)$`, "gm"))]
    .filter((m) => (m[1] as string).split(",").includes(label))
    .reduce((sum, m) => sum + Number(m[2]), 0);

describe("the worker's own /metrics", () => {
  it("shows how long vps.instances jobs waited and ran once an instance was stopped through it", async () => {
    const url = (await c.worker.waitFor(/metrics on (\S+)/))[1] as string;
    const { createTenant } = await c.operator.request(CreateTenantDocument, { input: { name: "metrics" } });
    const { createApiToken } = await c.operator.request(CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "m" } });
    const t = c.client(createApiToken.token);
    const { createInstance } = await t.request(CreateInstanceDocument, { input: { poolId: c.poolId, flavor: "tiny", imageId: c.imageId } });
    await waitForState(t, createInstance.id, "RUNNING", 30_000);
    // A create runs without a job (admission places it; the host's reports are reconciled where they arrive);
    // a stop is the reconciler's, through the worker's queue.
    await t.request(StopInstanceDocument, { id: createInstance.id });
    await waitForState(t, createInstance.id, "STOPPED", 30_000);

    let text = "";
    // The run is observed as it returns, a moment after the state a client reads.
    await until("vps.instances runs counted", async () => {
      text = await (await fetch(url)).text();
      return count(text, "bc_job_duration_seconds", 'job="vps.instances"') > 0;
    });
    const families = new Map((parsePrometheusTextFormat(text) as { name: string; type: string }[]).map((f) => [f.name, f.type]));
    expect(families.get("bc_job_wait_seconds")).toBe("HISTOGRAM");
    expect(families.get("bc_job_duration_seconds")).toBe("HISTOGRAM");
    expect(families.get("bc_jobs")).toBe("GAUGE");
    expect(families.get("bc_writes_total")).toBe("COUNTER");
    expect(families.get("process_resident_memory_bytes")).toBe("GAUGE");
    expect(count(text, "bc_job_wait_seconds", 'job="vps.instances"')).toBeGreaterThan(0);
    // The API's figures are the server's: the worker serves none of them.
    expect(families.has("bc_graphql_requests_total")).toBe(false);
    expect((await fetch(url.replace(/\/metrics$/, "/healthz"))).status).toBe(200);
  });
});
