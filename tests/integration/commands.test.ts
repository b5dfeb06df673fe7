import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as bc from "../../sdk/client.ts";
import { startWorker } from "../../worker/index.ts";
import { until } from "../support/fixtures.ts";
import { expectCode, type Harness, startHarness } from "../support/harness.ts";
import { invariantViolations } from "../support/ledger.ts";
import { walk } from "../support/reconcile.ts";

/**
 * Host commands, server side: this test plays the host with a node credential of its own, speaking the real
 * protocol (the nodeCommands stream, reportCommand), so it can do what a real agent must never do — report
 * twice, report late, report on another node's command — and see the server hold its ground.
 */

let h: Harness;
let worker: { close(): Promise<void> };
let pool: { id: string };
let imageId: string;
let op: bc.Client;
beforeAll(async () => {
  // A short command deadline and a quick sweep, so a command given up on is seen in a second or two.
  h = await startHarness({ HOST_COMMAND_TIMEOUT_MS: "1500", RECONCILE_SWEEP_MS: "200", NODE_LOST_GRACE_MS: "60000" });
  worker = await startWorker(h.platform);
  op = h.operator;
  ({ createPool: pool } = await op.request(bc.CreatePoolDocument, { input: { name: "cmd", class: "VPS_HOST", ipv4Range: "10.33.0.0/24" } }));
  await op.request(bc.CreateFlavorDocument, { input: { poolId: pool.id, name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 } });
  ({
    registerImage: { id: imageId },
  } = await op.request(bc.RegisterImageDocument, {
    input: { name: "img", source: "https://images.invalid/i.qcow2", sha256: "d".repeat(64), format: "QCOW2", public: true },
  }));
});
afterAll(async () => {
  await worker?.close();
  await h?.close();
});

/** A host of the pool, joined with a token, that has reported its capacity: its credential and node id. */
async function host(name: string) {
  const { createJoinToken } = await op.request(bc.CreateJoinTokenDocument, { poolId: pool.id });
  const { joinNode } = await bc.createClient({ url: h.url }).request(bc.JoinNodeDocument, { token: createJoinToken.token, name });
  const client = bc.createClient({ url: h.url, token: joinNode.credential });
  await client.request(bc.ReportStatusDocument, { report: { generation: 0, instances: [], capacity: { vcpus: 8, memoryMib: 8192, diskGib: 100, gpus: [] } } });
  return { ...joinNode, client };
}

/** Subscribe to a node's commands and collect them. */
async function commands(credential: string) {
  const ws = await bc.createWsClient({ url: h.url, token: credential, retryAttempts: 0 });
  const got: { id: string; kind: string; deadline: string; args: Record<string, string> }[] = [];
  const errors: unknown[] = [];
  void (async () => {
    try {
      for await (const p of ws.subscribe(bc.NodeCommandsDocument)) got.push(p.nodeCommands.command as (typeof got)[number]);
    } catch (e) {
      errors.push(e);
    }
  })();
  return { got, errors, close: () => ws.dispose() };
}

/** A running instance on the given host (the host's reports are played by `walk`). */
async function running(t: Awaited<ReturnType<Harness["tenant"]>>, key: string) {
  const { createInstance } = await t.client.request(bc.CreateInstanceDocument, { input: { poolId: pool.id, flavor: "small", imageId, idempotencyKey: key } });
  await walk(h.platform, createInstance.id, ["scheduling", "provisioning", "starting", "running"]);
  return createInstance;
}

/**
 * A new host that takes whatever is created next (every other host of the pool cordoned), a running instance
 * of a new tenant's on it, and the host's command stream.
 */
async function aloneOn(name: string, key: string) {
  for (const { id } of (await op.request(bc.NodesDocument, { poolId: pool.id })).nodes) await op.request(bc.SetNodeStateDocument, { id, state: "CORDONED" });
  const joined = await host(name);
  const t = await h.tenant();
  const vm = await running(t, key);
  expect(vm.nodeId).toBe(joined.nodeId);
  return { host: joined, t, vm, stream: await commands(joined.credential) };
}

const reasons = async (id: string) =>
  (await h.platform.db.prisma.instanceEvent.findMany({ where: { instanceId: id }, orderBy: { version: "asc" } })).map((e) => e.reason);
/**
 * How many messages this process sent PostgreSQL naming `text` while `fn` ran: node-postgres is the platform's
 * only way to the database, and a write's statements carry their parameters (a command's id) in their text.
 */
async function messagesNaming(text: string, fn: () => Promise<unknown>): Promise<number> {
  return (await sentNaming(text, fn)).length;
}

/** The messages themselves, to say what a count that is off was made of. */
async function sentNaming(text: string, fn: () => Promise<unknown>): Promise<string[]> {
  type Query = (this: unknown, ...a: unknown[]) => unknown;
  const proto = pg.Client.prototype as unknown as { query: Query };
  const query = proto.query;
  const seen: string[] = [];
  proto.query = function (...a) {
    const sent = typeof a[0] === "string" ? a[0] : ((a[0] as { text?: string } | null)?.text ?? "");
    if (sent.includes(text)) seen.push(sent.replace(/\s+/g, " "));
    return query.apply(this, a);
  };
  try {
    await fn();
  } finally {
    proto.query = query;
  }
  return seen;
}

/** The audit rows of a host's reports on a command: what each said. */
const commandAudit = async (id: string) =>
  (await h.platform.db.prisma.auditLog.findMany({ where: { targetId: id, action: "reportCommand" }, orderBy: { id: "asc" } })).map((a) => a.details);
const snapshot = async (id: string) => (await op.request(bc.InstanceSnapshotDocument, { id })).instanceSnapshot;

describe("host commands", () => {
  it("go to their node once per stream, are acknowledged, and settle on the first final report only", async () => {
    const a = await host("a");
    const t = await h.tenant();
    const vm = await running(t, "one");
    expect(vm.nodeId).toBe(a.nodeId);
    const stream = await commands(a.credential);
    const { snapshotInstance: snap } = await op.request(bc.SnapshotInstanceDocument, { id: vm.id });
    expect(snap).toMatchObject({ state: "CREATING", instanceId: vm.id, nodeId: a.nodeId, sizeBytes: null });
    await until("the command to reach the host", () => stream.got.length === 1, 10_000);
    const cmd = stream.got[0] as (typeof stream.got)[number];
    expect(cmd).toMatchObject({ kind: "instance.snapshot", args: { instanceId: vm.id, snapshotId: snap.id } });
    expect(new Date(cmd.deadline).getTime()).toBeGreaterThan(Date.now());

    // Another snapshot while this one is in flight is refused; so is a tenant, and another node's word on it.
    await expectCode(op.request(bc.SnapshotInstanceDocument, { id: vm.id }), "PRECONDITION_FAILED");
    await expectCode(t.client.request(bc.SnapshotInstanceDocument, { id: vm.id }), "FORBIDDEN");
    const b = await host("b");
    await expectCode(b.client.request(bc.ReportCommandDocument, { report: { id: cmd.id, state: "succeeded", result: { sizeBytes: 1 } } }), "NOT_FOUND");
    await expectCode(a.client.request(bc.ReportCommandDocument, { report: { id: cmd.id, state: "done" } }), "INVALID_INPUT");

    expect((await a.client.request(bc.ReportCommandDocument, { report: { id: cmd.id, state: "running" } })).reportCommand.state).toBe("running");
    expect((await a.client.request(bc.ReportCommandDocument, { report: { id: cmd.id, state: "running" } })).reportCommand.state).toBe("running");
    const done = { id: cmd.id, state: "succeeded", result: { sizeBytes: 4096 } };
    expect((await a.client.request(bc.ReportCommandDocument, { report: done })).reportCommand.state).toBe("succeeded");
    // Sent again (the agent did not hear the answer), or contradicted: the first final word stands.
    expect((await a.client.request(bc.ReportCommandDocument, { report: done })).reportCommand.state).toBe("succeeded");
    expect((await a.client.request(bc.ReportCommandDocument, { report: { id: cmd.id, state: "failed", error: "late" } })).reportCommand.state).toBe(
      "succeeded",
    );
    await expect.poll(async () => (await snapshot(snap.id))?.state, { timeout: 10_000, interval: 50 }).toBe("READY");
    expect(await snapshot(snap.id)).toMatchObject({ sizeBytes: 4096, error: null });
    expect(await reasons(vm.id)).toEqual(expect.arrayContaining(["requested:snapshot", "snapshot:ready"]));
    // A new stream (a reconnecting agent) is not sent what is finished.
    const again = await commands(a.credential);
    const { restoreInstance } = await op.request(bc.RestoreInstanceDocument, { id: vm.id, snapshotId: snap.id });
    expect(restoreInstance.state).toBe("RUNNING");
    await until("the restore to reach the host", () => again.got.length === 1 && stream.got.length === 2, 10_000);
    expect(again.got.map((c) => c.kind)).toEqual(["instance.restore"]);
    await a.client.request(bc.ReportCommandDocument, { report: { id: again.got[0]?.id, state: "succeeded" } });
    await expect.poll(() => reasons(vm.id), { timeout: 10_000, interval: 50 }).toContain("restored");
    await stream.close();
    await again.close();
  });

  it("takes a host's answer to a pause or resume as its word on the domain, so a report that says the same is no news", async () => {
    const { host: a, t, vm, stream } = await aloneOn("power", "power");
    const row = async () =>
      (
        await h.platform.read((sql) =>
          sql.query<{ state: string; version: number; observedState: string | null; observedGeneration: number; observedAt: Date | null }>(
            `SELECT state, version, observed_state AS "observedState", observed_generation AS "observedGeneration", observed_at AS "observedAt"
               FROM instances WHERE id = $1`,
            [vm.id],
          ),
        )
      )[0];
    const pause = () => t.client.request(bc.PauseInstanceDocument, { id: vm.id });
    const resume = () => t.client.request(bc.StartInstanceDocument, { id: vm.id });
    // Reported as the agent does, naming the command (settled in the report's one message: core/commands/power.ts),
    // and without the name, as an agent of before did (lock, record, then change).
    for (const named of [true, false])
      for (const [ask, kind, state, observed] of [
        [pause, "instance.pause", "paused", "PAUSED"],
        [resume, "instance.resume", "running", "RUNNING"],
      ] as const) {
        const before = stream.got.length;
        // The owner's request: the lock, the change, its command and audit row, and COMMIT in one message
        // (power-requests.ts). Counted once the reconciler is done with the instance (a pass on the create's last
        // step, or on the report before, names it too).
        await until("the reconciler to be idle", async () =>
          (await h.platform.jobs.depth()).every((d) => d.name !== "vps.instances" || d.waiting + d.active === 0),
        );
        const { retries, guessesMissed } = h.platform.counts;
        // The request's own messages, which carry its reason: a reconcile pass that the 200 ms sweep starts
        // between the request's commit and the host's answer (the instance is not yet where its owner wants it)
        // names the instance too, in a message of its own.
        const sent = (await sentNaming(vm.id, ask)).filter((m) => m.includes("'requested:"));
        // Its one message may be sent again only if the database asked for a retry (a deadlock with a write of
        // the same process, under load); a guess that missed here would be a defect.
        expect(h.platform.counts.guessesMissed).toBe(guessesMissed);
        const said = sent.map((m) => m.slice(0, 300)).join("\n");
        expect(sent.length, said).toBeGreaterThanOrEqual(1);
        expect(sent.length, said).toBeLessThanOrEqual(1 + h.platform.counts.retries - retries);
        expect(sent[0]).toMatch(/^(PREPARE .*; )?BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; EXECUTE .*; COMMIT$/);
        await until(`the ${kind} to reach the host`, () => stream.got.slice(before).some((c) => c.kind === kind), 10_000);
        const cmd = stream.got.slice(before).find((c) => c.kind === kind) as (typeof stream.got)[number];
        const generation = Number(cmd.args.generation);
        expect(generation).toBeGreaterThan(0);
        // The generation the request's change gave the instance, as its stored command says and its host was told.
        const [stored] = await h.platform.read((sql) =>
          sql.query<{ args: unknown; specGeneration: number }>(
            `SELECT c.args, i.spec_generation AS "specGeneration" FROM host_commands c JOIN instances i ON i.id = c.instance_id WHERE c.id = $1`,
            [cmd.id],
          ),
        );
        expect(stored).toEqual({ args: cmd.args, specGeneration: generation });
        const power = named ? { power: { kind, instanceId: vm.id } } : {};
        const messages = await messagesNaming(cmd.id, () =>
          a.client.request(bc.ReportCommandDocument, { report: { id: cmd.id, state: "succeeded", result: {}, ...power } }),
        );
        // Named, the report is recorded, settled, audited and committed in one message; unnamed, in two.
        expect(messages).toBe(named ? 1 : 2);
        const answered = await row();
        // Settled in the report's own write: the instance moved with the command's generation observed.
        expect(answered).toMatchObject({ state, observedState: state, observedGeneration: generation });
        expect(await commandAudit(cmd.id)).toEqual([{ kind, instanceId: vm.id, state: "succeeded", error: null }]);
        // The pass the host makes on the spec that asks for the same reports it: nothing is written for it.
        const capacity = { vcpus: 8, memoryMib: 8192, diskGib: 100, gpus: [] };
        await a.client.request(bc.ReportStatusDocument, { report: { generation, instances: [{ id: vm.id, state }], capacity } });
        expect(await row()).toEqual(answered);
        expect((await t.client.request(bc.InstanceDocument, { id: vm.id })).instance?.state).toBe(observed);
      }
    expect((await reasons(vm.id)).filter((r) => r === "host:paused" || r === "host:resumed")).toEqual([
      "host:paused",
      "host:resumed",
      "host:paused",
      "host:resumed",
    ]);
    await stream.close();
  });

  it("takes any other owner's request the general way after its one message found nothing to do, as if it had not tried", async () => {
    const { t, vm, stream } = await aloneOn("guess", "guess");
    const row = async () =>
      (
        await h.platform.read((sql) =>
          sql.query<{ state: string; desiredState: string; version: number; commands: number }>(
            `SELECT state, desired_state AS "desiredState", version, (SELECT count(*)::int FROM host_commands c WHERE c.instance_id = i.id) AS commands
               FROM instances i WHERE id = $1`,
            [vm.id],
          ),
        )
      )[0];
    const audited = async () =>
      (await h.platform.db.prisma.auditLog.findMany({ where: { targetId: vm.id }, orderBy: { id: "asc" } })).map((a) => [a.action, a.details]);
    const { retries, guessesMissed } = h.platform.counts;
    const before = { row: await row(), audit: await audited() };
    // Another tenant: not found, whichever move it asks for, and nothing is written.
    const other = await h.tenant();
    await expectCode(other.client.request(bc.PauseInstanceDocument, { id: vm.id }), "NOT_FOUND");
    await expectCode(other.client.request(bc.StartInstanceDocument, { id: vm.id }), "NOT_FOUND");
    expect({ row: await row(), audit: await audited() }).toEqual(before);
    // Asked to run while it runs: nothing changes, and no audit row.
    expect((await t.client.request(bc.StartInstanceDocument, { id: vm.id })).startInstance).toMatchObject({ state: "RUNNING", desiredState: "RUNNING" });
    expect({ row: await row(), audit: await audited() }).toEqual(before);
    // Stopped, then started: no command for the host (the spec says run), one audit row per request.
    await t.client.request(bc.StopInstanceDocument, { id: vm.id });
    await walk(h.platform, vm.id, ["stopped"]);
    expect((await t.client.request(bc.StartInstanceDocument, { id: vm.id })).startInstance.desiredState).toBe("RUNNING");
    // Paused before it runs again: wanted, with no command either (the host has nothing running to pause).
    expect((await t.client.request(bc.PauseInstanceDocument, { id: vm.id })).pauseInstance.desiredState).toBe("PAUSED");
    expect(await row()).toMatchObject({ desiredState: "paused", commands: 0 });
    expect(await audited()).toEqual([
      ...before.audit,
      ["stopInstance", { desired: "stopped" }],
      ["startInstance", { desired: "running" }],
      ["pauseInstance", { desired: "paused" }],
    ]);
    expect(stream.got).toEqual([]);
    // A guess that did not hold is no contention: it is counted apart from the database's retries. Five missed:
    // the other tenant's two, the start of a running instance, the start of a stopped one, the pause of that.
    expect(h.platform.counts.guessesMissed - guessesMissed).toBe(5);
    expect(h.platform.counts.retries).toBe(retries);
    expect(await invariantViolations(h.platform)).toEqual([]);
    await stream.close();
  });

  it("settles a named pause or resume in its report only where the command, its instance and the owner's wish agree", async () => {
    const { host: a, t, vm, stream } = await aloneOn("named", "named");
    const stateOf = async () => (await t.client.request(bc.InstanceDocument, { id: vm.id })).instance?.state;
    const next = async (kind: string, ask: () => Promise<unknown>) => {
      const before = stream.got.length;
      await ask();
      await until(`the ${kind} to reach the host`, () => stream.got.slice(before).some((c) => c.kind === kind), 10_000);
      return stream.got.slice(before).find((c) => c.kind === kind) as (typeof stream.got)[number];
    };
    const pauseCmd = await next("instance.pause", () => t.client.request(bc.PauseInstanceDocument, { id: vm.id }));
    // Another node naming it: not its command, and nothing is recorded.
    const b = await host("named-b");
    await expectCode(
      b.client.request(bc.ReportCommandDocument, { report: { id: pauseCmd.id, state: "succeeded", power: { kind: "instance.pause", instanceId: vm.id } } }),
      "NOT_FOUND",
    );
    // A name that is no pause or resume, or no instance id: refused as input, and nothing is recorded.
    for (const power of [
      { kind: "instance.snapshot", instanceId: vm.id },
      { kind: "instance.pause", instanceId: "inst_nope" },
    ])
      await expectCode(a.client.request(bc.ReportCommandDocument, { report: { id: pauseCmd.id, state: "succeeded", power } }), "INVALID_INPUT");
    expect(await commandAudit(pauseCmd.id)).toEqual([]);
    // Its own host naming another instance (of the right shape): the report is recorded, its statement changes
    // no instance, and the reconciler settles the pause as it settles any command.
    const other = `inst_${"a".repeat(52)}`;
    const wrong = { id: pauseCmd.id, state: "succeeded", result: {}, power: { kind: "instance.pause", instanceId: other } };
    expect((await a.client.request(bc.ReportCommandDocument, { report: wrong })).reportCommand.state).toBe("succeeded");
    await expect.poll(stateOf, { timeout: 10_000, interval: 50 }).toBe("PAUSED");
    // Heard again, named right this time: the first word stood, and nothing more is written.
    const right = { ...wrong, power: { kind: "instance.pause", instanceId: vm.id } };
    expect((await a.client.request(bc.ReportCommandDocument, { report: right })).reportCommand.state).toBe("succeeded");
    expect(await commandAudit(pauseCmd.id)).toEqual([{ kind: "instance.pause", instanceId: vm.id, state: "succeeded", error: null }]);
    expect((await reasons(vm.id)).filter((r) => r === "host:paused")).toEqual(["host:paused"]);

    // A resume whose owner asked to pause again before the host answered: the answer moves nothing (the spec
    // asks for paused, and the host is told so), and the command is settled all the same.
    const resumeCmd = await next("instance.resume", () => t.client.request(bc.StartInstanceDocument, { id: vm.id }));
    await t.client.request(bc.PauseInstanceDocument, { id: vm.id });
    const late = { id: resumeCmd.id, state: "succeeded", result: {}, power: { kind: "instance.resume", instanceId: vm.id } };
    expect((await a.client.request(bc.ReportCommandDocument, { report: late })).reportCommand.state).toBe("succeeded");
    const settled = async () =>
      (
        await h.platform.read((sql) =>
          sql.query<{ settled: boolean }>(`SELECT settled_at IS NOT NULL AS settled FROM host_commands WHERE id = $1`, [resumeCmd.id]),
        )
      )[0]?.settled;
    await expect.poll(settled, { timeout: 10_000, interval: 50 }).toBe(true);
    expect(await stateOf()).toBe("PAUSED");
    expect(await reasons(vm.id)).not.toContain("host:resumed");
    expect(await invariantViolations(h.platform)).toEqual([]);
    await stream.close();
  });

  it("gives up a command its host does not finish by the deadline, and the snapshot fails with why", async () => {
    // The other hosts take nothing new: the instance lands on this one, which never answers.
    const { vm, stream } = await aloneOn("c", "slow");
    const { snapshotInstance: snap } = await op.request(bc.SnapshotInstanceDocument, { id: vm.id });
    await expect.poll(async () => (await snapshot(snap.id))?.state, { timeout: 15_000, interval: 100 }).toBe("FAILED");
    expect((await snapshot(snap.id))?.error).toMatch(/did not finish instance\.snapshot before its deadline/);
    expect(await reasons(vm.id)).toContain("snapshot:failed");
    // The host's word after the deadline changes nothing; a new snapshot can be taken.
    const cmd = await h.platform.read((sql) =>
      sql.query<{ id: string; state: string }>(`SELECT id, state FROM host_commands WHERE args->>'snapshotId' = $1`, [snap.id]),
    );
    expect(cmd[0]?.state).toBe("expired");
    await stream.close();
  });

  it("cancels what an instance had in flight when it is deleted, and its snapshots go with it", async () => {
    const t = await h.tenant();
    const vm = await running(t, "doomed");
    const { snapshotInstance: snap } = await op.request(bc.SnapshotInstanceDocument, { id: vm.id });
    await expectCode(op.request(bc.RestoreInstanceDocument, { id: vm.id, snapshotId: snap.id }), "PRECONDITION_FAILED");
    await expectCode(op.request(bc.RestoreInstanceDocument, { id: vm.id, snapshotId: "snap_unknown" }), "NOT_FOUND");
    await t.client.request(bc.DeleteInstanceDocument, { id: vm.id });
    await walk(h.platform, vm.id, ["deleting", "deleted"]);
    await h.platform.jobs.enqueue("vps.instances", { instanceId: vm.id });
    await expect.poll(async () => (await snapshot(snap.id))?.state, { timeout: 10_000, interval: 50 }).toBe("DELETED");
    const cmd = await h.platform.read((sql) =>
      sql.query<{ state: string; settled: boolean }>(`SELECT state, settled_at IS NOT NULL AS settled FROM host_commands WHERE instance_id = $1`, [vm.id]),
    );
    expect(cmd).toEqual([{ state: "cancelled", settled: true }]);
    expect(await invariantViolations(h.platform)).toEqual([]);
  });

  it("refuses a snapshot of an instance that is not running, and the stream to anyone but a node", async () => {
    const t = await h.tenant();
    const { createInstance } = await t.client.request(bc.CreateInstanceDocument, {
      input: { poolId: pool.id, flavor: "small", imageId, desiredState: "STOPPED", idempotencyKey: "cold" },
    });
    await expectCode(op.request(bc.SnapshotInstanceDocument, { id: createInstance.id }), "PRECONDITION_FAILED");
    await expectCode(op.request(bc.SnapshotInstanceDocument, { id: "inst_missing" }), "NOT_FOUND");
    const tenantStream = await commands(t.token);
    await until("the stream to be refused", () => tenantStream.errors.length > 0, 10_000);
    expect((tenantStream.errors[0] as { code?: string }).code).toBe("FORBIDDEN");
    await tenantStream.close();
  });
});
