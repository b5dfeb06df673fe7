import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventsHorizon } from "../../core/books/retention.ts";
import { CreateInstanceDocument, watchInstance, watchInstanceEvents } from "../../sdk/client.ts";
import { prune } from "../../worker/jobs/retention.ts";
import { type Harness, startHarness } from "../support/harness.ts";

// The platform's clock is the test's: history ages by moving it, never by waiting.
const T0 = new Date("2026-01-01T00:00:00Z");
const DAY = 86_400_000;
let clock = T0;
let h: Harness;
beforeAll(async () => {
  h = await startHarness(
    // Small batches, so that one run deletes in several statements.
    { RETENTION_BATCH: "2", RETENTION_EVENTS_DAYS: "30", RETENTION_AUDIT_DAYS: "60", RETENTION_COMMANDS_DAYS: "7" },
    { now: () => clock },
  );
});
afterAll(async () => {
  await h?.close();
});

const sql = <T>(text: string, params: unknown[] = []) => h.platform.read((s) => s.query<T>(text, params));
const count = async (text: string, params: unknown[] = []) => (await sql<{ n: number }>(text, params))[0]?.n ?? -1;

async function create(t: Awaited<ReturnType<Harness["tenant"]>>, pool: { poolId: string; imageId: string }) {
  return (await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } })).createInstance;
}

describe("retention", () => {
  let t: Awaited<ReturnType<Harness["tenant"]>>;
  let pool: Awaited<ReturnType<Harness["hostedPool"]>>;
  let recent: { id: string };
  let oldCursor: string;

  it("deletes events, audit rows and settled commands older than it keeps, in batches, and nothing newer", async () => {
    t = await h.tenant();
    pool = await h.hostedPool();
    const old = [await create(t, pool), await create(t, pool), await create(t, pool)];
    const first = await sql<{ position: string }>(`SELECT min(position)::text AS position FROM instance_events WHERE instance_id = $1`, [old[0]?.id]);
    oldCursor = first[0]?.position as string;
    const node = pool.nodeIds[0];
    // Host commands: three settled at T0 (one with exec output), one never settled.
    for (const [id, settled] of [
      ["cmd_a", T0],
      ["cmd_b", T0],
      ["cmd_c", T0],
      ["cmd_open", null],
    ] as const)
      await sql(`INSERT INTO host_commands (id, node_id, kind, args, state, deadline, settled_at) VALUES ($1, $2, 'instance.exec', '{}', $3, $4, $5)`, [
        id,
        node,
        settled ? "succeeded" : "running",
        new Date(T0.getTime() + DAY),
        settled,
      ]);
    await sql(`INSERT INTO exec_output (command_id, seq, stream, data) VALUES ('cmd_a', 1, 'stdout', 'x'), ('cmd_a', 2, 'stdout', 'y')`);

    clock = new Date(T0.getTime() + 31 * DAY);
    recent = await create(t, pool);
    const oldEvents = await count(`SELECT count(*)::int AS n FROM instance_events WHERE at < $1`, [new Date(T0.getTime() + DAY)]);
    expect(oldEvents).toBe(9); // created, schedule, placed for each
    const auditBefore = await count(`SELECT count(*)::int AS n FROM audit_log`);

    await prune(h.platform);
    expect(await count(`SELECT count(*)::int AS n FROM instance_events WHERE at < $1`, [new Date(T0.getTime() + DAY)])).toBe(0);
    expect(await count(`SELECT count(*)::int AS n FROM instance_events WHERE instance_id = $1`, [recent.id])).toBe(3);
    const kept = await sql<{ min: string }>(`SELECT min(position)::text AS min FROM instance_events WHERE instance_id = $1`, [recent.id]);
    const horizon = await h.platform.read(eventsHorizon);
    expect(horizon).toBeGreaterThan(BigInt(oldCursor));
    expect(horizon).toBeLessThan(BigInt(kept[0]?.min as string));
    // Audit rows are kept 60 days: none gone yet. Settled commands (7 days) are, with their output.
    expect(await count(`SELECT count(*)::int AS n FROM audit_log`)).toBe(auditBefore);
    expect((await sql<{ id: string }>(`SELECT id FROM host_commands WHERE id LIKE 'cmd_%' ORDER BY id`)).map((r) => r.id)).toEqual(["cmd_open"]);
    expect(await count(`SELECT count(*)::int AS n FROM exec_output WHERE command_id = 'cmd_a'`)).toBe(0);

    clock = new Date(T0.getTime() + 61 * DAY);
    await prune(h.platform);
    expect(await count(`SELECT count(*)::int AS n FROM audit_log WHERE at < $1`, [new Date(T0.getTime() + DAY)])).toBe(0);
    expect(await count(`SELECT count(*)::int AS n FROM audit_log WHERE target_id = $1`, [recent.id])).toBe(1);
  });

  it("refuses a cursor older than the history kept; the SDK watcher starts again from now and says so", async () => {
    const resyncs: { cursor: string | null; message: string }[] = [];
    const seen: string[] = [];
    const stop = new AbortController();
    const reading = (async () => {
      for await (const e of watchInstanceEvents({ url: h.url, token: t.token, after: oldCursor, signal: stop.signal, onResync: (w) => resyncs.push(w) }))
        seen.push(`${e.instance.id} ${e.toState}`);
    })();
    const base = h.app.hub.subscriptions();
    await expect.poll(() => resyncs.length === 1 && h.app.hub.subscriptions() >= base, { timeout: 5000, interval: 20 }).toBe(true);
    expect(resyncs[0]).toMatchObject({ cursor: oldCursor, message: expect.stringContaining("older than the event history kept") });
    // From now: nothing of what came before, and the next change.
    await expect.poll(() => h.app.hub.subscriptions(), { timeout: 5000, interval: 20 }).toBeGreaterThan(0);
    const next = await create(t, pool);
    await expect.poll(() => seen, { timeout: 10_000, interval: 20 }).toContain(`${next.id} PENDING`);
    expect(seen.every((s) => s.startsWith(next.id))).toBe(true);
    stop.abort();
    await reading;
  });

  it("replays what is kept from cursor 0 and from the horizon itself", async () => {
    const horizon = (await h.platform.read(eventsHorizon)).toString();
    for (const after of ["0", horizon]) {
      const versions: number[] = [];
      const stop = new AbortController();
      const reading = (async () => {
        for await (const e of watchInstance({ url: h.url, token: t.token, id: recent.id, after, signal: stop.signal })) {
          versions.push(e.version);
          if (versions.length === 3) stop.abort();
        }
      })();
      await reading;
      expect(versions).toEqual([1, 2, 3]);
    }
  });
});
