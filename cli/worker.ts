import { loadConfig } from "../infra/config.ts";
import { openPlatform } from "../infra/platform.ts";
import { startWorker } from "../worker/index.ts";

/** `bc worker`: the reconcilers and periodic jobs of the job catalog. */
export async function workerCommand() {
  const config = await loadConfig();
  const platform = await openPlatform(config);
  const worker = await startWorker(platform);
  process.stdout.write(`worker running (${config.redisUrl ? "BullMQ on Redis" : "in-memory jobs"})\n`);
  const stop = async () => {
    await worker.close();
    await platform.close();
    process.exit(0);
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
}
