import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Queue } from "bullmq";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startAgent } from "../../agent/index.ts";
import { crashDomain, createFakeRuntime, injectFailure, setDomainAddresses } from "../../agent/runtimes/fake/index.ts";
import { type Handlers, queueName } from "../../infra/jobs.ts";
import {
  CreateFlavorDocument,
  CreateInstanceDocument,
  CreateJoinTokenDocument,
  CreatePoolDocument,
  InstanceDocument,
  JoinNodeDocument,
  NodesDocument,
  RegisterImageDocument,
  ReportStatusDocument,
  SetNodeStateDocument,
  StartInstanceDocument,
  StopInstanceDocument,
} from "../../sdk/client.ts";
import { reconcileInstance } from "../../worker/jobs/reconcile-instance.ts";
import { sha256Of, until } from "../support/fixtures.ts";
import { type Harness, redisUrl, startHarness } from "../support/harness.ts";
import { eventViolations, type Hosts, hostEnv, startHosts, waitForState } from "../support/hosts.ts";
import { invariantViolations } from "../support/ledger.ts";

/**
 * The instance lifecycle against the reference's state table, on simulated hosts: a retry out of error, a
 * recreate for a host that cannot start a stopped instance, crashes, a host without its pool's runtime,
 * addresses a runtime reports, and a wake-up that arrives while its instance's job runs.
 */

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
      input: { poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId, idempotencyKey: `st${n++}`, ...extra } as never,
    })
  ).createInstance;
const fakeDir = (i: number) => join(hosts.dirs[i] as string, "fake-host");
const domain = (i: number, id: string) => JSON.parse(readFileSync(join(fakeDir(i), "domains", `${id}.json`), "utf8"));
const nodes = async () => (await hosts.h.operator.request(NodesDocument, { poolId: hosts.poolId })).nodes.filter((x) => !x.gone && x.name.startsWith("host-"));
/** Which simulated host (index into hosts.dirs) a node is. */
const hostOf = async (nodeId: string | null | undefined) => Number((await nodes()).find((x) => x.id === nodeId)?.name.split("-")[1]) - 1;
const reasons = async (id: string) =>
  (await hosts.h.platform.db.prisma.instanceEvent.findMany({ where: { instanceId: id }, orderBy: { version: "asc" } })).map((e) => e.reason);
const instance = async (t: Tenant, id: string) => (await t.client.request(InstanceDocument, { id })).instance;

describe("error is not a dead end", () => {
  it("start moves an instance in error to starting, and it runs", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const host = await hostOf(running?.nodeId);
    await t.client.request(StopInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "STOPPED");
    // A start no host could make (not retryable): error, with the host's words.
    injectFailure(fakeDir(host), "start", { error: "kernel image is missing", retryable: false, times: 1 });
    await t.client.request(StartInstanceDocument, { id: inst.id });
    const failed = await waitForState(t.client, inst.id, "ERROR");
    expect(failed?.conditions).toEqual([{ type: "RuntimeError", reason: "HostReported", message: "kernel image is missing" }]);
    expect(failed?.desiredState).toBe("RUNNING");

    // The owner's start, although it already wants it running, is a retry.
    await t.client.request(StartInstanceDocument, { id: inst.id });
    const back = await waitForState(t.client, inst.id, "RUNNING");
    expect(back?.conditions).toEqual([]);
    expect(back?.nodeId).toBe(running?.nodeId);
    expect(domain(host, inst.id).state).toBe("running");
    const why = await reasons(inst.id);
    expect(why.slice(why.indexOf("host:failed"))).toEqual(["host:failed", "requested:retry", "retry", "host:running"]);
    expect(await eventViolations(hosts.h)).toEqual([]);
  });

  it("stop moves an instance in error to stopped", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const host = await hostOf(running?.nodeId);
    await t.client.request(StopInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "STOPPED");
    injectFailure(fakeDir(host), "start", { error: "kernel image is missing", retryable: false, times: 1 });
    await t.client.request(StartInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "ERROR");
    await t.client.request(StopInstanceDocument, { id: inst.id });
    expect((await waitForState(t.client, inst.id, "STOPPED"))?.conditions).toEqual([]);
  });
});

describe("a host that cannot start a stopped instance", () => {
  it("leads to a recreate on another node, with the books balanced", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const host = await hostOf(running?.nodeId);
    await t.client.request(StopInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "STOPPED");
    const lease = (await instance(t, inst.id))?.addresses;
    injectFailure(fakeDir(host), "start", { error: "no hugepages left on this host", retryable: true, times: 1 });
    await t.client.request(StartInstanceDocument, { id: inst.id });
    const moved = await waitForState(t.client, inst.id, "RUNNING");
    expect(moved?.nodeId).not.toBe(running?.nodeId);
    // The address is the instance's, not the host's: it keeps it.
    expect(moved?.addresses).toEqual(lease);
    const row = await hosts.h.platform.db.prisma.instance.findUniqueOrThrow({ where: { id: inst.id } });
    expect(row).toMatchObject({ attempts: 1, excludedNodes: [running?.nodeId] });
    const why = await reasons(inst.id);
    const requested = why.lastIndexOf("requested:running");
    const recreated = why.indexOf("recreate:host-cannot-start");
    expect(recreated).toBeGreaterThan(requested);
    expect(why.slice(recreated)).toEqual(expect.arrayContaining(["placed", "host:running"]));
    // The host hears the start from its spec as the request commits, so its refusal can come before the
    // reconciler's `start` step (stopped → recreate at once) or after it (starting → stopped, then recreate).
    const between = why.slice(requested + 1, recreated);
    expect([[], ["start", "host:start-refused"]]).toContainEqual(between);
    // The refusing host's domain is nobody's now: an orphan, removed after the grace.
    await until("the old domain to be removed", async () => {
      try {
        domain(host, inst.id);
        return false;
      } catch {
        return true;
      }
    });
    expect(await invariantViolations(hosts.h.platform)).toEqual([]);
    expect(await eventViolations(hosts.h)).toEqual([]);
  });
});

describe("a guest that crashes", () => {
  it("goes to error with a RuntimeError naming the crash, is started again while its owner wants it running, up to a bound", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const host = await hostOf(running?.nodeId);
    const crashes = async () => (await reasons(inst.id)).filter((r) => r === "host:crashed").length;
    const restarts = async () => (await reasons(inst.id)).filter((r) => r === "restart:crashed").length;
    // MAX_RECREATE_ATTEMPTS is 3 here: two crashes are restarted, the third is left for the owner.
    for (let crash = 1; crash <= 2; crash++) {
      crashDomain(fakeDir(host), inst.id);
      await until(`restart ${crash}`, async () => (await restarts()) === crash);
      await waitForState(t.client, inst.id, "RUNNING");
      expect(await crashes()).toBe(crash);
    }
    crashDomain(fakeDir(host), inst.id);
    const held = await waitForState(t.client, inst.id, "ERROR");
    expect(held?.desiredState).toBe("RUNNING");
    expect(held?.conditions).toEqual([
      { type: "RuntimeError", reason: "GuestCrashed", message: "fake: the guest crashed; 3 crashes in 10 minutes: it stays stopped until it is started" },
    ]);
    // Error stops the domain on its host; the crash is not booted over.
    await until("the crashed domain to be stopped", () => domain(host, inst.id).state === "stopped");
    const why = await reasons(inst.id);
    expect(why.slice(why.indexOf("host:crashed"), why.indexOf("host:crashed") + 3)).toEqual(["host:crashed", "restart:crashed", "host:running"]);
    expect(why).not.toContain("host:powered-off");

    // From error, the owner's intent: stopped, then running again.
    await t.client.request(StopInstanceDocument, { id: inst.id });
    expect((await waitForState(t.client, inst.id, "STOPPED"))?.conditions).toEqual([]);
    await t.client.request(StartInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "RUNNING");
    expect(await eventViolations(hosts.h)).toEqual([]);
  });
});

describe("a host without its pool's runtime", () => {
  it("refuses the pool's spec, visibly: the node is REFUSING, its instances say why, nothing is converged", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const host = await hostOf(running?.nodeId);
    const nodeId = running?.nodeId as string;
    // The same host (same node, same domains) comes back with an agent whose runtime is not the pool's.
    await hosts.stop(host);
    hosts.agents[host] = await startAgent({
      server: hosts.h.url,
      name: `host-${host + 1}`,
      stateDir: hosts.dirs[host] as string,
      runtime: createFakeRuntime({ dir: fakeDir(host), serves: ["fake"], capacity: { vcpus: 8, memoryMib: 16384, diskGib: 200, gpus: [] } }),
      heartbeatMs: 300,
    });
    const stateOfNode = async () => (await nodes()).find((x) => x.id === nodeId)?.state;
    await expect.poll(stateOfNode, { timeout: 15_000, interval: 50 }).toBe("REFUSING");
    const refused = {
      type: "RuntimeError",
      reason: "RuntimeMissing",
      message: `host host-${host + 1} does not run this pool's runtime (libvirt-kvm) and refuses its instances`,
    };
    await expect.poll(async () => (await instance(t, inst.id))?.conditions, { timeout: 15_000, interval: 50 }).toEqual([refused]);

    // What the owner asks now reaches the host's spec, and the host answers it without acting on it.
    await t.client.request(StopInstanceDocument, { id: inst.id });
    const answered = async () => {
      const node = await hosts.h.platform.db.prisma.node.findUniqueOrThrow({ where: { id: nodeId } });
      return node.reportedGeneration >= node.specGeneration;
    };
    await until("the refusing host to answer the newest spec", answered);
    expect(domain(host, inst.id).state).toBe("running");
    expect((await instance(t, inst.id))?.state).toBe("RUNNING");

    // It takes no new instances, and one placed on it before it refused goes elsewhere.
    for (let i = 0; i < 3; i++) expect((await create(t)).nodeId).not.toBe(nodeId);

    // Its own runtime again: ready, the condition gone, and what the owner asked is done.
    await hosts.stop(host);
    await hosts.start(host);
    await expect.poll(stateOfNode, { timeout: 15_000, interval: 50 }).toBe("READY");
    const stopped = await waitForState(t.client, inst.id, "STOPPED");
    expect(stopped?.conditions).toEqual([]);
    expect(domain(host, inst.id).state).toBe("stopped");
  });

  it("sends an instance it was to create to another node", async () => {
    const t = await hosts.h.tenant();
    const [target, ...others] = await nodes();
    const host = await hostOf(target?.id);
    // The target is placed on while its agent is away (still ready: not yet past the lost grace), and comes
    // back without the pool's runtime.
    for (const o of others) await hosts.h.operator.request(SetNodeStateDocument, { id: o.id, state: "CORDONED" });
    await hosts.stop(host);
    const inst = await create(t);
    expect(inst.nodeId).toBe(target?.id);
    for (const o of others) await hosts.h.operator.request(SetNodeStateDocument, { id: o.id, state: "READY" });
    hosts.agents[host] = await startAgent({
      server: hosts.h.url,
      name: `host-${host + 1}`,
      stateDir: hosts.dirs[host] as string,
      runtime: createFakeRuntime({ dir: fakeDir(host), serves: ["fake"] }),
      heartbeatMs: 300,
    });
    const moved = await waitForState(t.client, inst.id, "RUNNING");
    expect(moved?.nodeId).not.toBe(target?.id);
    expect(await reasons(inst.id)).toContain("recreate:runtime-missing");
    await hosts.stop(host);
    await hosts.start(host);
    await expect.poll(async () => (await nodes()).find((x) => x.id === target?.id)?.state, { timeout: 15_000, interval: 50 }).toBe("READY");
    expect(await invariantViolations(hosts.h.platform)).toEqual([]);
  });
});

describe("addresses", () => {
  it("are the lease, then what the instance's runtime reports", async () => {
    const t = await hosts.h.tenant();
    const inst = await create(t);
    const running = await waitForState(t.client, inst.id, "RUNNING");
    const host = await hostOf(running?.nodeId);
    const lease = running?.addresses[0] as string;
    expect(running?.addresses).toEqual([lease]);
    setDomainAddresses(fakeDir(host), inst.id, ["fd00:60::7", lease, "not-an-address"]);
    await expect.poll(async () => (await instance(t, inst.id))?.addresses, { timeout: 15_000, interval: 50 }).toEqual([lease, "fd00:60::7"]);
    expect(await reasons(inst.id)).toContain("host:addresses");
    setDomainAddresses(fakeDir(host), inst.id, []);
    await expect.poll(async () => (await instance(t, inst.id))?.addresses, { timeout: 15_000, interval: 50 }).toEqual([lease]);
    expect(await invariantViolations(hosts.h.platform)).toEqual([]);
  });
});

/**
 * A wake-up that lands while its instance's job runs: the job has read the instance (and found it at rest)
 * before the report that should move it. The test holds the job at that point, sends the report (its
 * enqueue comes while the job is active), then lets the job end; the instance must still act on the report.
 * No sweep runs, no agent sends heartbeats: nothing else could wake it.
 */
describe.each([
  ["BullMQ on Redis", {}],
  ["the in-memory runner", { REDIS_URL: "" }],
])("a host report that arrives while the instance's job runs (%s)", (_name, env) => {
  let h: Harness;
  let closeWorker: () => Promise<void>;
  let hold: { id: string; reached: () => void; release: Promise<void> } | null = null;
  let running = 0;
  let queue: Queue | null = null;

  beforeAll(async () => {
    h = await startHarness({ ...hostEnv, ...env });
    const handlers: Handlers = {
      "vps.instances": async ({ instanceId }) => {
        running++;
        try {
          await reconcileInstance(h.platform, instanceId);
          const held = hold?.id === instanceId ? hold : null;
          if (held) {
            hold = null;
            held.reached();
            await held.release;
          }
        } finally {
          running--;
        }
      },
      "vps.sweep": async () => {},
      "vps.poll": async () => {},
      "vps.providers": async () => {},
      "vps.sandboxes": async () => {},
      "vps.sandbox.expire": async () => {},
      "vps.usage": async () => {},
      "vps.retention": async () => {},
      "vps.tenants": async () => {},
    };
    const worker = await h.platform.jobs.run(handlers, h.platform.config, h.platform.log);
    closeWorker = () => worker.close();
    if (h.platform.config.redisUrl) queue = new Queue(queueName("vps.instances"), { connection: { url: redisUrl }, prefix: h.redisPrefix });
  });
  afterAll(async () => {
    await queue?.close();
    await closeWorker?.();
    await h?.close();
  });

  /** No run of any job under way or waiting: the next enqueue starts a new run. */
  const idle = async () => running === 0 && (!queue || (await queue.getActiveCount()) + (await queue.getWaitingCount()) === 0);

  it("is acted on once the job ends", async () => {
    const op = h.operator;
    const { createPool } = await op.request(CreatePoolDocument, { input: { name: "wake", class: "VPS_HOST", ipv4Range: "10.61.0.0/24" } });
    await op.request(CreateFlavorDocument, { input: { poolId: createPool.id, name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 } });
    const { registerImage } = await op.request(RegisterImageDocument, {
      input: { name: "debian", source: "https://images.invalid/debian.qcow2", sha256: sha256Of("e"), format: "QCOW2", public: true },
    });
    const { createJoinToken } = await op.request(CreateJoinTokenDocument, { poolId: createPool.id });
    const { joinNode } = await h.client().request(JoinNodeDocument, { token: createJoinToken.token, name: "wake-1" });
    const host = h.client(joinNode.credential);
    const capacity = { vcpus: 8, memoryMib: 16384, diskGib: 200 };
    const report = async (instances: { id: string; state: string }[]) => {
      const node = await h.platform.db.prisma.node.findUniqueOrThrow({ where: { id: joinNode.nodeId } });
      await host.request(ReportStatusDocument, { report: { generation: node.specGeneration, instances, capacity } });
    };
    await report([]);
    const t = await h.tenant();
    const { createInstance: inst } = await t.client.request(CreateInstanceDocument, {
      input: { poolId: createPool.id, flavor: "small", imageId: registerImage.id, idempotencyKey: "wake" },
    });
    await waitForState(t.client, inst.id, "PROVISIONING");
    await report([{ id: inst.id, state: "running" }]);
    await waitForState(t.client, inst.id, "RUNNING");
    const events = async () => (await h.platform.db.prisma.instanceEvent.findMany({ where: { instanceId: inst.id } })).map((e) => e.reason);
    await until("the instance's job to be idle", async () => (await events()).includes("host:running") && (await idle()));

    // A run of its job reads the instance at rest and is held there, still active.
    let release: () => void = () => {};
    let held = false;
    const released = new Promise<void>((r) => {
      release = r;
    });
    hold = { id: inst.id, reached: () => (held = true), release: released };
    await h.platform.jobs.enqueue("vps.instances", { instanceId: inst.id });
    await until("the job to be held after reading the instance", () => held);
    // The guest powers off; the report's wake-up is enqueued (the mutation returns after it) while the job runs.
    await report([{ id: inst.id, state: "stopped" }]);
    release();
    await expect.poll(events, { timeout: 10_000, interval: 50 }).toContain("host:powered-off");
  });
});
