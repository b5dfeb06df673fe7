import { subscribe, unsubscribe } from "node:diagnostics_channel";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startAgent } from "../../agent/index.ts";
import { clearFailures, createFakeRuntime, injectFailure } from "../../agent/runtimes/fake/index.ts";
import { applySpecChange, type NodeSpec, type NodeSpecChange, nodeSpecChange } from "../../contracts/host.ts";
import { TRACE_CHANNEL, type TracePoint } from "../../contracts/trace.ts";
import { buildNodeSpec } from "../../core/pools/hosted/spec.ts";
import {
  CreateInstanceDocument,
  CreateJoinTokenDocument,
  createWsClient,
  DeclareNodeGoneDocument,
  DeleteInstanceDocument,
  InstanceDocument,
  InstanceSnapshotDocument,
  JoinNodeDocument,
  NodeSpecChangesDocument,
  NodesDocument,
  PauseInstanceDocument,
  ReportStatusDocument,
  ResizeInstanceDocument,
  RestoreInstanceDocument,
  SetNodeStateDocument,
  SnapshotInstanceDocument,
  StartInstanceDocument,
  StopInstanceDocument,
} from "../../sdk/client.ts";
import { testKey, until } from "../support/fixtures.ts";
import { expectCode } from "../support/harness.ts";
import { eventViolations, type Hosts, startHosts, waitForState } from "../support/hosts.ts";
import { invariantViolations } from "../support/ledger.ts";

let hosts: Hosts;
beforeAll(async () => {
  hosts = await startHosts(3);
});
afterAll(() => hosts?.close());

type Tenant = Awaited<ReturnType<Hosts["h"]["tenant"]>>;
let n = 0;
const create = async (t: Tenant, extra: Record<string, unknown> = {}) =>
  (
    await t.client.request(CreateInstanceDocument, {
      input: { poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId, idempotencyKey: `k${n++}`, ...extra } as never,
    })
  ).createInstance;
const domainFile = (i: number, id: string) => join(hosts.dirs[i] as string, "fake-host", "domains", `${id}.json`);
const hostOf = async (nodeId: string | null) => {
  const nodes = await hosts.h.operator.request(NodesDocument, { poolId: hosts.poolId });
  return nodes.nodes.findIndex((x) => x.id === nodeId) >= 0 ? Number(nodes.nodes.find((x) => x.id === nodeId)?.name.split("-")[1]) - 1 : -1;
};

describe("instances converge on simulated hosts", () => {
  it("runs, stops, starts, resizes while stopped and deletes, through real host reports", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t, { sshKeys: [testKey()], userData: "#cloud-config\nhostname: web" });
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const host = await hostOf(running?.nodeId ?? null);
    expect(existsSync(domainFile(host, inst.id))).toBe(true);
    // The seed holds the keys and user data, and nothing of the platform's credentials.
    const seed = readFileSync(join(hosts.dirs[host] as string, "fake-host", "seeds", `${inst.id}.iso`), "utf8");
    expect(seed).toContain("hostname: web");
    expect(seed).not.toMatch(/bc[jnot]_/);

    await t.client.request(StopInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "STOPPED");
    const resized = (await t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "medium" })).resizeInstance;
    expect(resized.state).toBe("RESIZING");
    await waitForState(t.client, inst.id, "STOPPED");
    expect(JSON.parse(readFileSync(domainFile(host, inst.id), "utf8")).shape).toMatchObject({ vcpus: 2, memoryMib: 2048 });
    await t.client.request(StartInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "RUNNING");
    // Paused in memory on its host, and back.
    await t.client.request(PauseInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "PAUSED");
    expect(JSON.parse(readFileSync(domainFile(host, inst.id), "utf8")).state).toBe("paused");
    await t.client.request(StartInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "RUNNING");
    // Both went to the host as commands and were confirmed by its answers, not only by the spec after them.
    const commands = async () =>
      hosts.h.platform.read((sql) =>
        sql.query<{ kind: string; state: string }>(`SELECT kind, state FROM host_commands WHERE instance_id = $1 ORDER BY created_at, id`, [inst.id]),
      );
    await expect.poll(commands, { timeout: 10_000, interval: 50 }).toEqual([
      { kind: "instance.pause", state: "succeeded" },
      { kind: "instance.resume", state: "succeeded" },
    ]);
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    const gone = await waitForState(t.client, inst.id, "DELETED");
    expect(gone).toMatchObject({ allocationId: null, addresses: [] });
    expect(existsSync(domainFile(host, inst.id))).toBe(false);
    expect(await invariantViolations(hosts.h.platform)).toEqual([]);
    expect(await eventViolations(hosts.h)).toEqual([]);
  });

  it("marks a pause's path on the trace channel, from the request's write to the write of the host's answer", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    await waitForState(t.client, inst.id, "RUNNING");
    const points: TracePoint[] = [];
    const listen = (p: unknown) => points.push(p as TracePoint);
    subscribe(TRACE_CHANNEL, listen);
    try {
      await t.client.request(PauseInstanceDocument, { id: inst.id });
      await waitForState(t.client, inst.id, "PAUSED");
      const [cmd] = await hosts.h.platform.read((sql) =>
        sql.query<{ id: string }>(`SELECT id FROM host_commands WHERE instance_id = $1 AND kind = 'instance.pause'`, [inst.id]),
      );
      // The first time each point was reached for this pause, in the order the path takes them.
      const first = (point: TracePoint["point"], detail: string) => points.findIndex((p) => p.point === point && p.detail === detail);
      const path = [
        first("write.begin", "pauseInstance"),
        first("write.committed", "pauseInstance"),
        first("command.sent", `instance.pause ${cmd?.id}`),
        first("agent.command", `instance.pause ${cmd?.id}`),
        first("agent.report", `succeeded ${cmd?.id}`),
        first("write.begin", "reportCommand"),
        first("write.committed", "reportCommand"),
        first("write.applied", "reportCommand"),
      ];
      expect(path.every((i) => i >= 0)).toBe(true);
      expect(path).toEqual([...path].sort((a, b) => a - b));
      const at = path.map((i) => (points[i] as TracePoint).at);
      expect(at).toEqual([...at].sort((a, b) => a - b));
    } finally {
      unsubscribe(TRACE_CHANNEL, listen);
    }
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "DELETED");
  });

  it("says when an agent is at rest: nothing under way, and the server has its report of the newest spec", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const i = await hostOf(running?.nodeId ?? null);
    const agent = hosts.agents[i];
    await t.client.request(PauseInstanceDocument, { id: inst.id });
    const generations = async () =>
      (
        await hosts.h.platform.read((sql) =>
          sql.query<{ spec: number; reported: number }>(`SELECT spec_generation AS spec, reported_generation AS reported FROM nodes WHERE id = $1`, [
            running?.nodeId,
          ]),
        )
      )[0];
    // The spec behind the pause may still be on its way to the agent when idle() is first asked: at rest is
    // idle with the server holding a report of the node's newest generation.
    let rest: { spec: number; reported: number } | undefined;
    await until(
      "the host to be at rest",
      async () => {
        await agent?.idle();
        rest = await generations();
        return rest !== undefined && rest.reported === rest.spec;
      },
      10_000,
    );
    expect(agent?.converged()).toBe(rest?.spec);
    expect(JSON.parse(readFileSync(domainFile(i, inst.id), "utf8")).state).toBe("paused");
    expect((await t.client.request(InstanceDocument, { id: inst.id })).instance?.state).toBe("PAUSED");
  });

  it("creates stopped instances without booting them", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t, { desiredState: "STOPPED" });
    const stopped = await waitForState(t.client, inst.id, "STOPPED");
    const file = JSON.parse(readFileSync(domainFile(await hostOf(stopped?.nodeId ?? null), inst.id), "utf8"));
    expect(file.state).toBe("stopped");
  });
});

describe("snapshots through host commands", () => {
  it("saves a running instance's memory and disk on its host and restores it, and both go with the instance", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const host = await hostOf(running?.nodeId ?? null);
    const op = hosts.h.operator;
    const { snapshotInstance: snap } = await op.request(SnapshotInstanceDocument, { id: inst.id });
    const snapshot = async () => (await op.request(InstanceSnapshotDocument, { id: snap.id })).instanceSnapshot;
    await expect.poll(async () => (await snapshot())?.state, { timeout: 15_000, interval: 50 }).toBe("READY");
    expect((await snapshot())?.sizeBytes).toBeGreaterThan(0);
    const files = join(hosts.dirs[host] as string, "fake-host", "snapshots", inst.id, snap.id);
    expect(existsSync(files)).toBe(true);
    // The guest kept running through it: no stop ever reached the instance's timeline.
    expect((await t.client.request(InstanceDocument, { id: inst.id })).instance?.state).toBe("RUNNING");

    await op.request(RestoreInstanceDocument, { id: inst.id, snapshotId: snap.id });
    const reasons = async () =>
      (await hosts.h.platform.db.prisma.instanceEvent.findMany({ where: { instanceId: inst.id }, orderBy: { version: "asc" } })).map((e) => e.reason);
    await expect.poll(reasons, { timeout: 15_000, interval: 50 }).toContain("restored");
    expect((await reasons()).filter((r) => r.startsWith("host:"))).not.toContain("host:powered-off");
    await waitForState(t.client, inst.id, "RUNNING");

    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "DELETED");
    await expect.poll(async () => (await snapshot())?.state, { timeout: 15_000, interval: 50 }).toBe("DELETED");
    expect(existsSync(files)).toBe(false);
    expect(await invariantViolations(hosts.h.platform)).toEqual([]);
  });
});

describe("the host protocol", () => {
  it("trades a join token once, and only before it expires", async () => {
    const { createJoinToken } = await hosts.h.operator.request(CreateJoinTokenDocument, { poolId: hosts.poolId });
    const anon = hosts.h.client();
    const joined = (await anon.request(JoinNodeDocument, { token: createJoinToken.token, name: "extra-1" })).joinNode;
    expect(joined.credential).toMatch(/^bcn_/);
    await expectCode(anon.request(JoinNodeDocument, { token: createJoinToken.token, name: "extra-2" }), "UNAUTHENTICATED");
    const { createJoinToken: late } = await hosts.h.operator.request(CreateJoinTokenDocument, { poolId: hosts.poolId, ttlSeconds: 10 });
    await hosts.h.platform.db.prisma.joinToken.updateMany({ where: { expiresAt: late.expiresAt }, data: { expiresAt: new Date(Date.now() - 1000) } });
    await expectCode(anon.request(JoinNodeDocument, { token: late.token, name: "extra-3" }), "UNAUTHENTICATED");
    const t = await hosts.h.tenant();
    await expectCode(t.client.request(CreateJoinTokenDocument, { poolId: hosts.poolId }), "FORBIDDEN");
    // The extra node never reported: it takes no instances and is not declared lost.
    await hosts.h.operator.request(DeclareNodeGoneDocument, { id: joined.nodeId });
  });

  it("stops an agent for good once its node is declared gone", async () => {
    const { createJoinToken } = await hosts.h.operator.request(CreateJoinTokenDocument, { poolId: hosts.poolId });
    const dir = mkdtempSync(join(tmpdir(), "bc-gone-"));
    const agent = await startAgent({
      server: hosts.h.url,
      joinToken: createJoinToken.token,
      name: "doomed",
      stateDir: dir,
      runtime: createFakeRuntime({ dir: join(dir, "fake-host") }),
      heartbeatMs: 300,
    });
    try {
      let why: string | undefined;
      void agent.ended.then((w) => {
        why = w;
      });
      await hosts.h.operator.request(DeclareNodeGoneDocument, { id: agent.nodeId });
      await until("the agent to give up", () => why !== undefined, 15_000);
      // Cut by the revocation itself, or refused at a reconnect: either way the agent stops trying.
      expect(why).toMatch(/refused its credential \((credential revoked|the bearer token is unknown, expired or revoked)\); join again/);
    } finally {
      await agent.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("lets a node credential report for its own node only", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const { createJoinToken } = await hosts.h.operator.request(CreateJoinTokenDocument, { poolId: hosts.poolId });
    const other = (await hosts.h.client().request(JoinNodeDocument, { token: createJoinToken.token, name: "intruder" })).joinNode;
    const intruder = hosts.h.client(other.credential);
    // Claiming the instance is stopped, from a node it is not on, changes nothing.
    await intruder.request(ReportStatusDocument, {
      report: { generation: 999, instances: [{ id: inst.id, state: "stopped" }], capacity: { vcpus: 1, memoryMib: 1024, diskGib: 1 } },
    });
    const row = await hosts.h.platform.db.prisma.instance.findUniqueOrThrow({ where: { id: inst.id } });
    expect(row.observedState).toBe("running");
    expect(row.nodeId).toBe(running?.nodeId);
    await expectCode(
      t.client.request(ReportStatusDocument, { report: { generation: 1, instances: [], capacity: { vcpus: 1, memoryMib: 1, diskGib: 1 } } }),
      "FORBIDDEN",
    );
    await expectCode(intruder.request(ReportStatusDocument, { report: { generation: "x" } }), "INVALID_INPUT");
    await hosts.h.operator.request(DeclareNodeGoneDocument, { id: other.nodeId });
    await expectCode(
      intruder.request(ReportStatusDocument, { report: { generation: 1, instances: [], capacity: { vcpus: 1, memoryMib: 1, diskGib: 1 } } }),
      "UNAUTHENTICATED",
    );
  });
});

describe("the spec stream as changes", () => {
  it("sends a node's spec whole, then only what changed, and the changes add up to the whole spec", async () => {
    const t = await hosts.h.tenant();
    const nodes = (await hosts.h.operator.request(NodesDocument, { poolId: hosts.poolId })).nodes;
    const target = nodes.find((x) => x.name === "host-1") ?? nodes[0];
    if (!target) throw new Error("no node");
    const host = await hostOf(target.id);
    // Every create of this test lands on host-1: the others take no new instances meanwhile.
    const others = nodes.filter((x) => x.id !== target.id);
    for (const o of others) await hosts.h.operator.request(SetNodeStateDocument, { id: o.id, state: "CORDONED" });
    const credential = (JSON.parse(readFileSync(join(hosts.dirs[host] as string, "agent.json"), "utf8")) as { credential: string }).credential;
    const ws = await createWsClient({ url: hosts.h.url, token: credential });
    const changes: NodeSpecChange[] = [];
    const stream = ws.subscribe(NodeSpecChangesDocument);
    const reading = (async () => {
      for await (const m of stream) changes.push(nodeSpecChange.parse(m.nodeSpecChanges.change));
    })();
    try {
      await until("the whole spec", async () => changes.length > 0);
      expect(changes[0]?.since).toBeNull();
      const [a, b, c] = [await create(t), await create(t), await create(t)];
      for (const i of [a, b, c]) await waitForState(t.client, i.id, "RUNNING");
      const mark = changes.length;
      await t.client.request(StopInstanceDocument, { id: b.id });
      await waitForState(t.client, b.id, "STOPPED");
      // The stop changed one instance's spec: only that one is sent, though the host holds three or more.
      const stopped = changes.slice(mark).find((ch) => ch.instances.some((i) => i.id === b.id && i.power === "stopped"));
      expect(stopped?.instances.map((i) => i.id)).toEqual([b.id]);
      await t.client.request(DeleteInstanceDocument, { id: c.id });
      await waitForState(t.client, c.id, "DELETED");
      await until("c dropped", async () => changes.some((ch) => ch.dropped.includes(c.id)));

      // Each change follows the one before, and together they are the node's spec as the server would build it.
      for (let k = 1; k < changes.length; k++) expect(changes[k]?.since).toBe(changes[k - 1]?.generation);
      let spec: NodeSpec | null = null;
      for (const ch of changes) spec = applySpecChange(spec, ch);
      const whole = await hosts.h.platform.read((sql) => buildNodeSpec(sql, hosts.h.platform.sealer, hosts.h.platform.config.vps.hostNetwork, target.id));
      await until("the stream caught up", async () => (changes.at(-1)?.generation ?? 0) >= whole.generation);
      spec = null;
      for (const ch of changes) spec = applySpecChange(spec, ch);
      expect(spec).toEqual(whole);
      expect(spec?.instances.map((i) => i.id)).toEqual(expect.arrayContaining([a.id, b.id]));
      // A change that does not follow the spec held cannot be applied.
      expect(() => applySpecChange({ ...whole, generation: whole.generation - 1 }, { ...whole, since: whole.generation, dropped: [] })).toThrow(
        /does not follow/,
      );
    } finally {
      await stream.return?.();
      await reading.catch(() => {});
      await ws.dispose();
      for (const o of others) await hosts.h.operator.request(SetNodeStateDocument, { id: o.id, state: "READY" });
    }
  });
});

describe("faults", () => {
  it("marks a silent host lost with its instances, and recovers them when it reports again", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const host = await hostOf(running?.nodeId ?? null);
    await hosts.stop(host);
    await waitForState(t.client, inst.id, "LOST");
    const nodes = (await hosts.h.operator.request(NodesDocument, { poolId: hosts.poolId })).nodes;
    expect(nodes.find((x) => x.id === running?.nodeId)?.state).toBe("LOST");
    await hosts.start(host);
    await waitForState(t.client, inst.id, "RUNNING");
    expect(await eventViolations(hosts.h)).toEqual([]);
  });

  it("resumes from the latest spec when an agent restarts after changes it missed", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const host = await hostOf(running?.nodeId ?? null);
    await hosts.stop(host);
    await t.client.request(StopInstanceDocument, { id: inst.id });
    await hosts.start(host);
    await waitForState(t.client, inst.id, "STOPPED");
    expect(JSON.parse(readFileSync(domainFile(host, inst.id), "utf8")).state).toBe("stopped");
  });

  it("removes a domain no instance owns, after the grace", async () => {
    const orphanId = `inst_${"o".repeat(52)}`;
    const rt = createFakeRuntime({ dir: join(hosts.dirs[0] as string, "fake-host") });
    await rt.create({
      id: orphanId,
      power: "running",
      vcpus: 1,
      memoryMib: 512,
      diskGib: 5,
      gpus: [],
      image: { url: "https://images.invalid/x.qcow2", sha256: "d".repeat(64), format: "qcow2" },
      sshKeys: [],
      userData: null,
      hostname: "orphan",
      nic: { bridge: "br0", mac: "52:54:00:00:00:01", address: null, prefix: null, gateway: null },
      env: {},
      network: { egress: "all", allow: [] },
      fromSnapshot: null,
    });
    await rt.close();
    await expect
      .poll(async () => (await hosts.h.platform.db.prisma.orphan.count({ where: { domainId: orphanId } })) > 0, { timeout: 10_000, interval: 50 })
      .toBe(true);
    await expect.poll(() => existsSync(domainFile(0, orphanId)), { timeout: 15_000, interval: 50 }).toBe(false);
    await expect.poll(async () => hosts.h.platform.db.prisma.orphan.count({ where: { domainId: orphanId } }), { timeout: 10_000, interval: 50 }).toBe(0);
  });

  it("recreates an instance on another host when its host cannot create it", async () => {
    const t = await hosts.h.tenant();
    // Only the target may take the create (the others are cordoned), and it will refuse it; then the others
    // open again and the recreate must land on one of them.
    const nodes = (await hosts.h.operator.request(NodesDocument, { poolId: hosts.poolId })).nodes.filter((x) => !x.gone && x.name.startsWith("host-"));
    const [target, ...others] = nodes;
    const host = Number(target?.name.split("-")[1]) - 1;
    injectFailure(join(hosts.dirs[host] as string, "fake-host"), "create", { error: "no room for the overlay on /var/lib", retryable: true, times: 1 });
    for (const o of others) await hosts.h.operator.request(SetNodeStateDocument, { id: o.id, state: "CORDONED" });
    const inst = await create(t);
    expect(inst.nodeId).toBe(target?.id);
    for (const o of others) await hosts.h.operator.request(SetNodeStateDocument, { id: o.id, state: "READY" });
    const running = await waitForState(t.client, inst.id, "RUNNING");
    expect(running?.nodeId).not.toBe(target?.id);
    const row = await hosts.h.platform.db.prisma.instance.findUniqueOrThrow({ where: { id: inst.id } });
    expect(row).toMatchObject({ attempts: 1, excludedNodes: [target?.id] });
    const reasons = (await hosts.h.platform.db.prisma.instanceEvent.findMany({ where: { instanceId: inst.id }, orderBy: { version: "asc" } })).map(
      (e) => e.reason,
    );
    expect(reasons).toContain("recreate:host-refused");
    expect(await invariantViolations(hosts.h.platform)).toEqual([]);
    expect(await eventViolations(hosts.h)).toEqual([]);
  });

  it("puts an instance no host can create in error, with the runtime's message", async () => {
    const t = await hosts.h.tenant();
    for (const dir of hosts.dirs) injectFailure(join(dir, "fake-host"), "create", { error: "image digest mismatch: got 1234", retryable: false, times: 1 });
    const inst = await create(t);
    const failed = await waitForState(t.client, inst.id, "ERROR");
    expect(failed?.conditions).toEqual([{ type: "RuntimeError", reason: "HostReported", message: "image digest mismatch: got 1234" }]);
    // Only the host it landed on used its injected failure: the others must not fail the next test's creates.
    for (const dir of hosts.dirs) clearFailures(join(dir, "fake-host"));
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "DELETED");
    expect(await invariantViolations(hosts.h.platform)).toEqual([]);
    expect((await t.client.request(InstanceDocument, { id: inst.id })).instance?.allocationId).toBeNull();
  });
});

describe("restarts under load", () => {
  it("converges everything while an agent restarts repeatedly", async () => {
    const t = await hosts.h.tenant();
    const ids: string[] = [];
    for (let round = 0; round < 3; round++) {
      const restarting = (async () => {
        await hosts.stop(1);
        await hosts.start(1);
      })();
      for (let i = 0; i < 4; i++) ids.push((await create(t)).id);
      await restarting;
    }
    for (const id of ids) await waitForState(t.client, id, "RUNNING", 20_000);
    const nodes = await hosts.h.platform.db.prisma.node.findMany({ where: { poolId: hosts.poolId, goneAt: null } });
    await expect
      .poll(
        async () =>
          (await hosts.h.platform.db.prisma.node.findMany({ where: { poolId: hosts.poolId, goneAt: null } })).every(
            (x) => x.reportedGeneration === x.specGeneration,
          ),
        { timeout: 10_000 },
      )
      .toBe(true);
    expect(nodes.length).toBeGreaterThan(0);
  });
});
