import type { Reader } from "../core/kernel/db.ts";

/** Event id → its position. */
export type Positions = Map<string, string>;

/**
 * Positions for committed events (the sequenced_positions migration), asked of the database by one call at a
 * time per process: writers that commit while a call is under way are served together by the next one. Every
 * call that finds events to position takes the one lock and flushes its own commit, so a process that sent one
 * call per write would queue its writers behind each other's flushes; this way a burst costs a flush or two.
 */
export function eventSequencer(db: Reader): (eventIds: readonly string[]) => Promise<Positions> {
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

  return (ids) =>
    new Promise<Positions>((resolve, reject) => {
      waiting.push({ ids, resolve, reject });
      if (!running) void drain();
    });
}
