import { Queue } from "bullmq";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { InstanceEventMessage } from "../../contracts/channels.ts";
import { SQL } from "../../core/kernel/sql.ts";
import { INLINE_PASSES } from "../../core/lifecycle/reconciler.ts";
import { openBus } from "../../infra/bus.ts";
import type { TransactionOptions } from "../../infra/db/index.ts";
import { queueName } from "../../infra/jobs.ts";
import { eventSequencer } from "../../infra/sequencer.ts";
import {
  CreateInstanceDocument,
  CreateJoinTokenDocument,
  createClient,
  InstanceDocument,
  JoinNodeDocument,
  ReportStatusDocument,
  StartInstanceDocument,
  StopInstanceDocument,
} from "../../sdk/client.ts";
import { sweep } from "../../worker/jobs/sweep.ts";
import { expectCode, type Harness, redisUrl, startHarness } from "../support/harness.ts";

let h: Harness;
let queue: Queue;
beforeAll(async () => {
  h = await startHarness();
  queue = new Queue(queueName("vps.instances"), { connection: { url: redisUrl }, prefix: h.redisPrefix });
});
afterAll(async () => {
  await queue?.close();
  await h?.close();
});

describe("deferred statements", () => {
  it("go with the write's last statement, audited or not, and not at all when the write rolls back", async () => {
    const rows = async (target: string) =>
      (await h.platform.read((sql) => sql.query<{ action: string }>(`SELECT action FROM audit_log WHERE target_id = $1 ORDER BY action`, [target]))).map(
        (r) => r.action,
      );
    const deferred = (target: string) =>
      SQL`INSERT INTO audit_log (actor_id, action, target_id, details, at) VALUES ('test', 'deferred', ${target}::text, '{}'::jsonb, now())`;
    const audited = `defer-a-${Date.now()}`;
    await h.platform.write({ actor: "test", action: "testDefer" }, async (w) => {
      w.defer(deferred(audited));
      w.audit({ targetId: audited });
    });
    expect(await rows(audited)).toEqual(["deferred", "testDefer"]);
    const plain = `defer-p-${Date.now()}`;
    await h.platform.write({ actor: "test" }, async (w) => w.defer(deferred(plain)));
    expect(await rows(plain)).toEqual(["deferred"]);
    const undone = `defer-u-${Date.now()}`;
    await expect(
      h.platform.write({ actor: "test" }, async (w) => {
        w.defer(deferred(undone));
        throw new Error("changed its mind");
      }),
    ).rejects.toThrow("changed its mind");
    expect(await rows(undone)).toEqual([]);
  });
});

describe("after commit", () => {
  it("publishes each change over Redis and wakes the reconciler once per instance", async () => {
    // A second process's view: its own Redis connections on the same prefix.
    const bus = await openBus({ redisUrl, prefix: h.redisPrefix });
    const seen: InstanceEventMessage[] = [];
    const batches: string[][] = [];
    const sub = bus.subscribe("instanceEvents");
    const reading = (async () => {
      for await (const m of sub) {
        seen.push(...m.events);
        batches.push(m.events.map((e) => e.instanceId));
      }
    })();
    // Subscribing is asynchronous: publish probes until the subscription is live.
    const probe: InstanceEventMessage = {
      cursor: "0",
      instanceId: "probe",
      tenantId: "",
      poolId: "",
      projectId: null,
      fromState: null,
      toState: "pending",
      version: 0,
    };
    await expect
      .poll(
        () => {
          h.platform.bus.publish("instanceEvents", { events: [probe] });
          return seen.length;
        },
        { timeout: 5000, interval: 50 },
      )
      .toBeGreaterThan(0);

    const t = await h.tenant();
    const pool = await h.hostedPool();
    const inst = (await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } })).createInstance;
    await t.client.request(StopInstanceDocument, { id: inst.id });
    await t.client.request(StartInstanceDocument, { id: inst.id });
    const mine = () => seen.filter((m) => m.instanceId === inst.id);
    // Created, scheduled and placed (one write, so one message), then stopped and started (one each).
    await expect.poll(() => mine().length, { timeout: 5000, interval: 20 }).toBe(5);
    expect(batches.filter((b) => b.includes(inst.id)).map((b) => b.length)).toEqual([3, 1, 1]);
    await sub.return?.();
    await reading;
    await bus.close();
    const rows = await h.platform.db.prisma.instanceEvent.findMany({ where: { instanceId: inst.id }, orderBy: { version: "asc" } });
    expect(mine().map((m) => [m.instanceId, m.version, m.cursor])).toEqual(rows.map((r) => [inst.id, r.version, r.position?.toString()]));

    // Three changes, one waiting job: the job id is the instance id.
    const job = await queue.getJob(inst.id);
    expect(job?.data).toEqual({ instanceId: inst.id });
    expect(await queue.getWaitingCount()).toBe(1);
  });

  it("wakes no job for a create that admission took as far as it goes before its host reports", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const inst = (await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } })).createInstance;
    expect(inst.state).toBe("PROVISIONING");
    expect(await queue.getJob(inst.id)).toBeUndefined();
  });

  it("reconciles a host report's news where it arrives, with no job behind it, and queues jobs for a report too large for that", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool({ nodes: [] });
    const { createJoinToken } = await h.operator.request(CreateJoinTokenDocument, { poolId: pool.poolId });
    const { joinNode } = await createClient({ url: h.url }).request(JoinNodeDocument, { token: createJoinToken.token, name: "news" });
    const node = createClient({ url: h.url, token: joinNode.credential });
    const capacity = { vcpus: 64, memoryMib: 262_144, diskGib: 4000, gpus: [] };
    await node.request(ReportStatusDocument, { report: { generation: 0, instances: [], capacity } });
    const create = async () =>
      (await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } })).createInstance.id;
    const generation = async () =>
      (await h.platform.read((sql) => sql.query<{ g: number }>(`SELECT spec_generation AS g FROM nodes WHERE id = $1`, [joinNode.nodeId])))[0]?.g ?? 0;
    const defined = (id: string) => ({ id, state: "stopped", addresses: [], error: null, retryable: false, shape: { vcpus: 2, memoryMib: 2048, diskGib: 20 } });
    const stateOf = async (id: string) => (await t.client.request(InstanceDocument, { id })).instance?.state;

    // The host says it defined the instance: the pass that answers (starting) is taken before the report returns.
    const one = await create();
    await node.request(ReportStatusDocument, { report: { generation: await generation(), instances: [defined(one)], capacity } });
    expect(await stateOf(one)).toBe("STARTING");
    expect(await queue.getJob(one)).toBeUndefined();

    // More news than the report's own passes take: each instance gets its job.
    const many: string[] = [];
    for (let i = 0; i <= INLINE_PASSES; i++) many.push(await create());
    await node.request(ReportStatusDocument, { report: { generation: await generation(), instances: [one, ...many].map(defined), capacity } });
    for (const id of many) expect(await queue.getJob(id)).toBeDefined();
  });

  it("gives a position to events whose writer committed them and died before asking, at the next sweep", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const inst = (await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } })).createInstance;
    const sql = (text: string, params: unknown[] = []) => h.platform.read((s) => s.query<{ id: string; position: string | null }>(text, params));
    // What a writer leaves when it dies between its commit and the sequencer: a committed event without a position.
    const [orphan] = await sql(
      `INSERT INTO instance_events (instance_id, tenant_id, pool_id, from_state, to_state, desired_state, reason, actor, version)
       SELECT id, tenant_id, pool_id, state, state, desired_state, 'test', 'test', version + 100 FROM instances WHERE id = $1 RETURNING id::text, position::text`,
      [inst.id],
    );
    expect(orphan?.position).toBeNull();
    const [head] = await sql(`SELECT '0' AS id, max(position)::text AS position FROM instance_events`);
    await sweep(h.platform);
    const [after] = await sql(`SELECT id::text, position::text FROM instance_events WHERE id = $1`, [orphan?.id]);
    expect(BigInt(after?.position ?? "0")).toBeGreaterThan(BigInt(head?.position ?? "0"));
  });

  it("positions a batch in id order from one block of the sequence, and concurrent calls never share or skip a position", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const inst = (await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } })).createInstance;
    type Row = { id: string; position: string | null };
    const sql = (text: string, params: unknown[] = []) => h.platform.read((s) => s.query<Row>(text, params));
    let version = 1000;
    const orphans = async (n: number) => {
      version += 100;
      return sql(
        `INSERT INTO instance_events (instance_id, tenant_id, pool_id, from_state, to_state, desired_state, reason, actor, version)
         SELECT id, tenant_id, pool_id, state, state, desired_state, 'test', 'test', $2 + k FROM instances, generate_series(1, $3::int) k
          WHERE id = $1 ORDER BY k RETURNING id::text, position::text`,
        [inst.id, version, n],
      );
    };
    const positions = async (ids: string[]) =>
      (await sql(`SELECT id::text, position::text FROM instance_events WHERE id = ANY($1::bigint[]) ORDER BY id`, [ids])).map((r) => r.position);

    // One call positions the whole batch: consecutive positions, in the order of the events' ids.
    const batch = (await orphans(5)).map((r) => r.id);
    const [called] = await sql(`SELECT '0' AS id, count(*)::text AS position FROM sequence_instance_events($1::bigint[])`, [batch]);
    expect(called?.position).toBe("5");
    const got = (await positions(batch)).map((p) => BigInt(p ?? "0"));
    expect(got.every((p) => p > 0n)).toBe(true);
    expect(got.map((p) => p - (got[0] as bigint))).toEqual([0n, 1n, 2n, 3n, 4n]);

    // Callers racing one another (and the sweep) while writers add more: every event ends with a position of its own.
    const added: string[] = [];
    await Promise.all(
      Array.from({ length: 8 }, async (_, i) => {
        const ids = (await orphans(1 + (i % 3))).map((r) => r.id);
        added.push(...ids);
        await sql(`SELECT id::text, position::text FROM sequence_instance_events($1::bigint[], $2)`, [ids, i % 4 === 0]);
      }),
    );
    const after = await positions(added);
    expect(after.every((p) => p !== null)).toBe(true);
    expect(new Set(after).size).toBe(added.length);
  });

  it("positions a lone write's events in the message that commits it, and a write begun beside it through the sequencer", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const inst = (await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } })).createInstance;
    const sequencer = eventSequencer(h.platform.db);
    let version = 5000;
    /** A transaction that inserts an event, as a write does: its own txid and the event's id. */
    const writeEvent = (options: TransactionOptions | undefined, hold?: Promise<void>) =>
      h.platform.db.transaction(async (sql) => {
        version += 1;
        const [row] = await sql.query<{ id: string; txid: string }>(
          `INSERT INTO instance_events (instance_id, tenant_id, pool_id, from_state, to_state, desired_state, reason, actor, version)
           SELECT id, tenant_id, pool_id, state, state, desired_state, 'test', 'test', $2 FROM instances WHERE id = $1
           RETURNING id::text, txid_current()::text AS txid`,
          [inst.id, version],
        );
        await hold;
        return row as { id: string; txid: string };
      }, options);
    /** Which transaction last wrote the event's row: its writer's (positioned in its commit) or a sequencer's. */
    const writtenBy = async (id: string) =>
      (
        await h.platform.read((s) =>
          s.query<{ xmin: string; position: string | null }>(`SELECT xmin::text, position::text FROM instance_events WHERE id = $1`, [id]),
        )
      )[0];

    const lone = sequencer.write();
    expect(lone.options).toBeDefined();
    let release = () => {};
    const held = new Promise<void>((r) => {
      release = r;
    });
    const first = writeEvent(lone.options, held);
    // Begun while the first is open: not alone, so it is positioned after its commit, by the sequencer.
    const beside = sequencer.write();
    expect(beside.options).toBeUndefined();
    const second = await writeEvent(beside.options).finally(beside.end);
    const secondAt = (await beside.positions([second.id])).get(second.id);
    release();
    const one = await first.finally(lone.end);
    const oneAt = (await lone.positions([one.id])).get(one.id);

    expect(await writtenBy(one.id)).toEqual({ xmin: one.txid, position: oneAt });
    const bySequencer = await writtenBy(second.id);
    expect(bySequencer?.position).toBe(secondAt);
    expect(bySequencer?.xmin).not.toBe(second.txid);
    // Committed second, positioned after the first's block; both are positions of their own.
    expect(BigInt(oneAt ?? "0")).toBeGreaterThan(BigInt(secondAt ?? "0"));
    // Both ended: the next write is alone again; one that rolls back leaves nothing unpositioned behind.
    const next = sequencer.write();
    expect(next.options).toBeDefined();
    await expect(
      h.platform.db
        .transaction(async (sql) => {
          await sql.query(`SELECT 1`);
          throw new Error("rolled back");
        }, next.options)
        .finally(next.end),
    ).rejects.toThrow("rolled back");
    expect(sequencer.write().options).toBeDefined();
  });

  it("publishes nothing and wakes nothing for a refused request", async () => {
    const t = await h.tenant({ quota: { instances: 0 } });
    const pool = await h.hostedPool();
    const before = await queue.getWaitingCount();
    await expectCode(t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } }), "QUOTA_EXCEEDED");
    expect(await queue.getWaitingCount()).toBe(before);
  });
});

describe("the bus on Redis", () => {
  it("hands a message to its own process's subscribers once (not again when Redis brings it back), and to others through Redis", async () => {
    // Two processes' buses on one prefix.
    const prefix = `${h.redisPrefix}:bus`;
    const [a, b] = [await openBus({ redisUrl, prefix }), await openBus({ redisUrl, prefix })];
    const heard = { a: [] as string[], b: [] as string[] };
    const listen = (bus: typeof a, into: string[]) => {
      const sub = bus.subscribe("execOutput", "k");
      void (async () => {
        for await (const m of sub) into.push(m.commandId);
      })();
      return sub;
    };
    const subs = [listen(a, heard.a), listen(b, heard.b)];
    try {
      // Subscribing is asynchronous: probes until each hears the other through Redis.
      await expect
        .poll(
          () => {
            a.publish("execOutput", { commandId: "probe-a" }, "k");
            return heard.b.length;
          },
          { timeout: 5000, interval: 50 },
        )
        .toBeGreaterThan(0);
      await expect
        .poll(
          () => {
            b.publish("execOutput", { commandId: "probe-b" }, "k");
            return heard.a.includes("probe-b");
          },
          { timeout: 5000, interval: 50 },
        )
        .toBe(true);
      a.publish("execOutput", { commandId: "one" }, "k");
      await expect.poll(() => heard.b.includes("one"), { timeout: 5000, interval: 10 }).toBe(true);
      // Once b has it, Redis has sent it back to a too; a message b sends now reaches a after that echo.
      b.publish("execOutput", { commandId: "after" }, "k");
      await expect.poll(() => heard.a.includes("after"), { timeout: 5000, interval: 10 }).toBe(true);
      expect(heard.a.filter((m) => m === "one")).toEqual(["one"]);
      expect(heard.b.filter((m) => m === "one")).toEqual(["one"]);
      for (const seen of [heard.a, heard.b]) expect(seen.filter((m) => m === "after")).toEqual(["after"]);
    } finally {
      for (const s of subs) await s.return?.();
      await a.close();
      await b.close();
    }
  });
});
