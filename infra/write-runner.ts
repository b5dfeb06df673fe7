import { tracePoint } from "../contracts/trace.ts";
import type { Clock } from "../core/kernel/clock.ts";
import type { IdSource } from "../core/kernel/ids.ts";
import { ContendedWrite, finishWrite, positionEvents, Write, type WriteOptions } from "../core/kernel/write.ts";
import type { Database } from "./db/index.ts";
import type { WriteEffects } from "./effects.ts";
import type { Logger } from "./log.ts";
import type { WriteCounts } from "./metrics.ts";
import type { EventSequencer } from "./sequencer.ts";

/** Runs `fn` as one Write (one transaction), then applies what it recorded (infra/platform.ts `Platform.write`). */
export type WriteFn = <T>(opts: WriteOptions, fn: (w: Write) => Promise<T>) => Promise<T>;

export interface WriteRunnerDeps {
  sequencer: EventSequencer;
  ids: IdSource;
  now: Clock;
  counts: WriteCounts;
  log: Logger;
  effects: WriteEffects;
}

const RETRYABLE = new Set(["40001", "40P01"]);
// Keys that concurrent identical requests race to insert (idempotent creates): the write that lost runs again
// and finds the winner's row.
const RETRY_ON_DUPLICATE = new Set(["instances_pkey", "ip_addresses_instance_id_key", "allocations_instance_id_key"]);

/** Deadlocks and serialisation failures are the database asking for a retry, not a user error; so is losing a create's race. */
function retryable(e: unknown): boolean {
  const { code, constraint } = e as { code?: string; constraint?: string };
  return !!code && (RETRYABLE.has(code) || (code === "23505" && !!constraint && RETRY_ON_DUPLICATE.has(constraint)));
}

/**
 * The write runner: the write path on `on`, the database itself (host work) or an API caller's share of it. Each
 * attempt begins, runs the domain, commits, tells hosts, has the sequencer position the events, and applies the
 * effects; contention is retried three times, and a guess that missed (only ever on attempt 1) takes none of them.
 */
export function writeRunner({ sequencer, ids, now, counts, log, effects }: WriteRunnerDeps): (on: Pick<Database, "transaction">) => WriteFn {
  const { tellHosts, apply } = effects;
  return (on) => async (wopts, fn) => {
    let retried = 0;
    for (let attempt = 1; ; attempt++) {
      tracePoint("write.begin", wopts.action ?? wopts.actor);
      const sequencing = sequencer.write();
      try {
        const [result, w] = await on
          .transaction(async (sql) => {
            const w = new Write(sql, ids, now(), wopts, attempt);
            const result = await fn(w);
            await finishWrite(w);
            return [result, w] as const;
          }, sequencing.options)
          .finally(sequencing.end);
        counts.writes++;
        tellHosts(w);
        tracePoint("write.committed", wopts.action ?? wopts.actor);
        // Committed whatever happens here: without positions its events are not published (subscribers'
        // polls read them), rather than the write reported as failed.
        await positionEvents(w, sequencing.positions).catch((err) => {
          log.warn("positioning committed events failed", { actor: wopts.actor, err: String(err) });
          w.events.splice(0);
        });
        await apply(w);
        tracePoint("write.applied", wopts.action ?? wopts.actor);
        return result;
      } catch (e) {
        if (e instanceof ContendedWrite && e.guess && attempt === 1) {
          counts.guessesMissed++;
          continue;
        }
        if (retried < 3 && retryable(e)) {
          retried++;
          counts.retries++;
          continue;
        }
        throw e;
      }
    }
  };
}
