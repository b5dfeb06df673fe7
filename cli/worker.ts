import { loadConfig } from "../infra/config.ts";
import { openPlatform } from "../infra/platform.ts";
import { startWorker } from "../worker/index.ts";
import { serveMetrics } from "../worker/metrics.ts";

/** `bc worker`: the reconcilers and periodic jobs of the job catalog, and with METRICS_PORT its own /metrics. */
export async function workerCommand() {
  const config = await loadConfig();
  const platform = await openPlatform(config);
  const worker = await startWorker(platform);
  const metrics = config.metricsPort === undefined ? null : await serveMetrics(platform.metrics, config.metricsPort, config.host, platform.log);
  process.stdout.write(`worker running (${config.redisUrl ? "BullMQ on Redis" : "in-memory jobs"})${metrics ? `; metrics on ${metrics.url}` : ""}\n`);
  const stop = async () => {
    await worker.close();
    await metrics?.close();
    await platform.close();
    process.exit(0);
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
}
