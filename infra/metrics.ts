import { Counter, collectDefaultMetrics, Gauge, Registry } from "prom-client";
import type { Jobs } from "./jobs.ts";

/** A counter whose value lives elsewhere (the hub, the platform's counts): set to it at each scrape. */
export const mirrorCounter =
  (registers: Registry[]) =>
  (name: string, help: string, value: () => number): Counter =>
    new Counter({
      name,
      help,
      registers,
      collect() {
        this.reset();
        this.inc(value());
      },
    });

/**
 * The process's own figures, one registry per platform: the server's `/metrics` and the worker's (its own port
 * when it runs alone) both show it, so in `bc dev` one scrape sees the API, the write path and the jobs together.
 * Process figures (memory, event loop), what this process's writes did, and each job's queue depth.
 */
/** What a process's writes have done: committed, events published, retried, and guesses that missed. */
export interface WriteCounts {
  writes: number;
  eventsPublished: number;
  retries: number;
  guessesMissed: number;
}

export function platformMetrics(counts: Readonly<WriteCounts>, jobs: Jobs): Registry {
  const registry = new Registry();
  const registers = [registry];
  collectDefaultMetrics({ register: registry });
  const mirror = mirrorCounter(registers);
  mirror("bc_events_published_total", "Instance events this process's writes published.", () => counts.eventsPublished);
  mirror("bc_writes_total", "Transactions this process's write path committed.", () => counts.writes);
  mirror("bc_write_retries_total", "Writes run again after a deadlock or serialisation failure.", () => counts.retries);
  mirror("bc_write_guesses_missed_total", "Writes sent in one message on a guess the row then refuted, run again the general way.", () => counts.guessesMissed);
  new Gauge({
    name: "bc_jobs",
    help: "Jobs of each catalog entry waiting (due or delayed) and running, over every worker (read from the queues).",
    labelNames: ["job", "status"],
    registers,
    async collect() {
      this.reset();
      for (const d of await jobs.depth()) {
        this.set({ job: d.name, status: "waiting" }, d.waiting);
        this.set({ job: d.name, status: "active" }, d.active);
      }
    },
  });
  return registry;
}
