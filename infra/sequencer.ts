import type { Reader } from "../core/kernel/db.ts";
import type { TransactionOptions } from "./db/index.ts";

/** Event id → its position. */
export type Positions = Map<string, string>;

/**
 * Positions for committed events (the sequenced_positions migration), asked of the database by one call at a
 * time per process: writers that commit while a call is under way are served together by the next one. Every
 * call that finds events to position takes the one lock and flushes its own commit, so a process that sent one
 * call per write would queue its writers behind each other's flushes; this way a burst costs a flush or two.
 */
export function eventSequencer(db: Reader): EventSequencer {
  let waiting: { ids: readonly string[]; resolve: (p: Positions) => void; reject: (e: unknown) => void }[] = [];
  let running = false;

  async function drain(): Promise<void> {
    running = true;
    while (waiting.length) {
      const batch = waiting;
      waiting = [];
      try {
        const rows = await db.read((sql) =>
          sql.query<{ id: string; position: string }>(`SELECT id::text AS id, position::text AS position FROM sequence_instance_events($1::bigint[])`, [
            batch.flatMap((b) => b.ids),
          ]),
        );
        const positions: Positions = new Map(rows.map((r) => [r.id, r.position]));
        for (const b of batch) b.resolve(positions);
      } catch (e) {
        for (const b of batch) b.reject(e);
      }
    }
    running = false;
  }

  const sequence = (ids: readonly string[]) =>
    new Promise<Positions>((resolve, reject) => {
      waiting.push({ ids, resolve, reject });
      if (!running) void drain();
    });

  let writing = 0;
  return {
    write() {
      // Alone: no other write of this process is open, so no sequencer call could serve this one with others.
      const alone = writing === 0;
      writing++;
      let given: Positions | null = null;
      let ended = false;
      const take = (rows: Record<string, unknown>[]) => {
        given = new Map(rows.map((r) => [String(r.id), String(r.position)]));
      };
      return {
        options: alone ? { beforeCommit: { text: POSITION_IN_COMMIT, rows: take } } : undefined,
        end() {
          if (!ended) writing--;
          ended = true;
        },
        positions: (ids) => (given && ids.every((id) => given?.has(id)) ? Promise.resolve(given) : sequence(ids)),
      };
    },
  };
}

/** Positions every event this transaction sees unpositioned, its own among them (the position_in_commit migration). */
const POSITION_IN_COMMIT = `SELECT id::text AS id, position::text AS position FROM position_pending_instance_events()`;

export interface EventSequencer {
  /**
   * A write's transaction is about to begin. If no other write of this process is open, its events are
   * positioned inside it, in the message that commits it (`options`): a lone write (a host's report, a pause)
   * saves the sequencer's round trip and flush. Otherwise they wait for the next sequencer call, which serves
   * every writer that committed meanwhile. `end` once the transaction is over, committed or not.
   */
  write(): {
    options: TransactionOptions | undefined;
    end(): void;
    /** Once committed: the positions of these events (the write's own). */
    positions(eventIds: readonly string[]): Promise<Positions>;
  };
}
