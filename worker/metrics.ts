import { createServer } from "node:http";
import { Histogram, type Registry } from "prom-client";
import type { JobObserver } from "../infra/jobs.ts";
import type { Logger } from "../infra/log.ts";

/** Reconciles take milliseconds, a provider sweep or a usage window seconds; delayed starts can lag a minute. */
const BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** The histograms once per registry: a platform that runs a second worker (tests do) keeps counting in the first's. */
function histogram(registry: Registry, name: string, help: string, labelNames: string[]): Histogram {
  return (registry.getSingleMetric(name) as Histogram | undefined) ?? new Histogram({ name, help, labelNames, buckets: BUCKETS, registers: [registry] });
}

/** Each job's wait and run, by catalog name, on the platform's registry (so `bc dev`'s one /metrics shows them). */
export function jobMetrics(registry: Registry): JobObserver {
  const wait = histogram(registry, "bc_job_wait_seconds", "From when a job was due (enqueued, or its delay over) to its first attempt's start.", ["job"]);
  const duration = histogram(registry, "bc_job_duration_seconds", "How long each attempt of a job ran, by outcome (ok, failed).", ["job", "outcome"]);
  return {
    waited: (job, seconds) => wait.observe({ job }, seconds),
    ran: (job, seconds, outcome) => duration.observe({ job, outcome }, seconds),
  };
}

/**
 * `bc worker`'s own `/metrics` (and `/healthz`), for a worker that runs as a process of its own: it has no API
 * port, so this is how its job timings, its writes and its process figures get scraped.
 */
export async function serveMetrics(registry: Registry, port: number, host: string, log: Logger): Promise<{ url: string; close(): Promise<void> }> {
  const server = createServer(async (req, res) => {
    const path = (req.url ?? "/").split("?")[0];
    if (path === "/healthz") return void res.writeHead(200, { "content-type": "text/plain" }).end("ok\n");
    if (path !== "/metrics") return void res.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
    try {
      const text = await registry.metrics();
      res.writeHead(200, { "content-type": registry.contentType }).end(text);
    } catch (e) {
      log.warn("metrics could not be gathered", { err: String(e) });
      res.writeHead(503, { "content-type": "text/plain" }).end("metrics unavailable\n");
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, resolve);
  });
  const addr = server.address();
  const bound = typeof addr === "object" && addr ? addr.port : port;
  return {
    url: `http://${host.includes(":") ? `[${host}]` : host}:${bound}/metrics`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
