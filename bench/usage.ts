/**
 * Metering cost: `npm run bench:usage -- [--spans 10000] [--rounds 5]`.
 *
 * A PostgreSQL platform with `spans` meter spans open across one 5-minute window (10,000 instance-windows by
 * default, a third of them with a GPU): each round closes that window with the job's own function, then
 * restores the spans. The limit it is compared with is the cost of reading those span rows alone on the same
 * server (the least any metering must do). Prints both per round's p50 and their ratio.
 */
import { closeWindow, WINDOW_MS } from "../core/books/usage.ts";
import { benchArgs, benchPlatform, exitWhenDone, percentile } from "./lib.ts";

const args = benchArgs({ spans: 10_000, rounds: 5 });
const p50 = (xs: number[]) =>
  percentile(
    [...xs].sort((a, b) => a - b),
    50,
  );

async function run() {
  const window = Math.floor((Date.now() - 2 * WINDOW_MS) / WINDOW_MS) * WINDOW_MS;
  const start = new Date(window);
  const end = new Date(window + WINDOW_MS);
  // Its clock: the window closed a while ago.
  const bench = await benchPlatform({ poolSize: 4, env: {} });
  const { platform } = bench;
  try {
    await platform.db.session((sql) =>
      sql.query(
        `INSERT INTO meter_spans (id, allocation_id, instance_id, tenant_id, project_id, warm, vcpus, memory_mib, gpus, started_at, metered_until)
         SELECT 'mspan_' || n, 'alloc_' || n, 'inst_' || n, 'ten_' || (n % 100), NULL, n % 10 = 0, 1 + n % 8, 1024 * (1 + n % 16),
                CASE WHEN n % 3 = 0 THEN '[{"model":"l4","count":1}]'::jsonb ELSE '[]'::jsonb END, $1, $1
           FROM generate_series(1, $2::int) AS n`,
        [start, args.spans],
      ),
    );
    await platform.db.session((sql) => sql.query(`ANALYZE meter_spans`));
    const metering: number[] = [];
    const reading: number[] = [];
    for (let r = 0; r < args.rounds; r++) {
      const t0 = performance.now();
      const rows = await platform.read((sql) => sql.query(`SELECT * FROM meter_spans WHERE metered_until < $1`, [end]));
      reading.push(performance.now() - t0);
      if (rows.length !== args.spans) throw new Error(`read ${rows.length} spans, expected ${args.spans}`);
      const t1 = performance.now();
      const closed = await platform.write({ actor: "usage" }, closeWindow);
      metering.push(performance.now() - t1);
      if (!closed) throw new Error("the window did not close");
      const [{ n } = { n: 0 }] = await platform.read((sql) => sql.query<{ n: number }>(`SELECT count(DISTINCT instance_id)::int AS n FROM usage_records`));
      if (n !== args.spans) throw new Error(`metered ${n} instances, expected ${args.spans}`);
      // Back to the start: the same window again next round.
      await platform.db.session(async (sql) => {
        await sql.query(`DELETE FROM usage_records`);
        await sql.query(`DELETE FROM usage_windows`);
        await sql.query(`UPDATE meter_spans SET metered_until = started_at`);
      });
    }
    const m = p50(metering);
    const read = p50(reading);
    console.log(`usage bench: ${args.spans} instance-windows on PostgreSQL, ${args.rounds} rounds`);
    console.log(`  closing the window (records, spans moved, marker): p50 ${m.toFixed(1)} ms`);
    console.log(`  reading the span rows alone:                       p50 ${read.toFixed(1)} ms`);
    console.log(`  ratio: ${(m / read).toFixed(2)}x the read; ${((m / args.spans) * 1000).toFixed(1)} µs per instance-window`);
  } finally {
    await bench.close();
  }
}

exitWhenDone(run());
