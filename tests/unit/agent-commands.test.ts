import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CommandRunner, type CommandRunnerOptions } from "../../agent/commands.ts";
import { Converger } from "../../agent/converge.ts";
import { InstanceLocks } from "../../agent/locks.ts";
import { createFakeRuntime, type FakeOptions, injectFailure } from "../../agent/runtimes/fake/index.ts";
import type { Runtime } from "../../agent/runtimes/runtime.ts";
import { type CommandReport, type HostCommand, type InstanceSpec, instanceSpec, type NodeSpec } from "../../contracts/host.ts";
import { sha256Of, until } from "../support/fixtures.ts";

/** Host commands on the agent: the runner, its journal, and its lock shared with the converger, on the fake runtime. */

const A = `inst_${"a".repeat(52)}`;
const B = `inst_${"b".repeat(52)}`;
const hour = 60 * 60 * 1000;

function spec(id: string, power: InstanceSpec["power"] = "running"): InstanceSpec {
  return instanceSpec.parse({
    id,
    power,
    vcpus: 1,
    memoryMib: 512,
    diskGib: 10,
    gpus: [],
    image: { url: "https://images.example/base.qcow2", sha256: sha256Of("d"), format: "qcow2" },
    sshKeys: [],
    userData: null,
    hostname: "h",
    nic: { bridge: "br0", mac: "52:54:00:00:00:01", address: null, prefix: null, gateway: null },
  });
}

const command = (id: string, kind: HostCommand["kind"], instanceId: string, snapshotId: string, deadline = new Date(Date.now() + hour)): HostCommand => ({
  id,
  kind,
  deadline: deadline.toISOString(),
  args: { instanceId, snapshotId },
});

let root: string;
let fakeDir: string;
const open: { close(): Promise<void> }[] = [];
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "bc-agent-commands-"));
  fakeDir = join(root, "fake-host");
});
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
  await rm(root, { recursive: true, force: true });
});

async function host(fake: Partial<FakeOptions> = {}): Promise<Runtime> {
  const rt = createFakeRuntime({ dir: fakeDir, ...fake });
  open.push(rt);
  for (const id of [A, B]) {
    await rt.create(spec(id));
    await rt.start(id);
  }
  return rt;
}

function runner(rt: Runtime, o: Partial<CommandRunnerOptions> = {}) {
  const sent: CommandReport[] = [];
  const r = new CommandRunner({
    stateDir: root,
    runtime: rt,
    locks: new InstanceLocks(),
    send: async (report) => void sent.push(structuredClone(report)),
    retry: { attemptMs: 200, firstMs: 10, maxMs: 40 },
    ...o,
  });
  open.push(r);
  return { r, sent };
}

const journal = (id: string) => JSON.parse(readFileSync(join(root, "commands", `${id}.json`), "utf8"));
const stateOf = async (rt: Runtime, id: string) => (await rt.list()).find((d) => d.id === id)?.state;
const finals = (sent: CommandReport[]) => sent.filter((s) => s.state !== "running");

describe("host commands", () => {
  it("runs a command once per id, even delivered twice at once or again to a new runner on the same state dir", async () => {
    const rt = await host();
    const snap = command("cmd_one", "instance.snapshot", A, "snap_one");
    const first = runner(rt);
    await Promise.all([first.r.receive(snap), first.r.receive(snap)]);
    await until("the final report to be confirmed", () => journal("cmd_one").confirmed === true);
    expect(first.sent.map((s) => s.state)).toEqual(["running", "succeeded"]);
    const result = first.sent[1]?.result as { sizeBytes: number };
    expect(result.sizeBytes).toBeGreaterThan(0);
    expect(journal("cmd_one")).toMatchObject({ state: "succeeded", result, confirmed: true });
    await first.r.close();

    // Were it run again, the runtime would now refuse: the new runner only answers from its journal.
    injectFailure(fakeDir, "snapshot", { error: "snapshot ran twice", retryable: false });
    const second = runner(rt);
    await second.r.receive(snap);
    await until("the final report again", () => second.sent.length > 0);
    expect(second.sent).toEqual([{ id: "cmd_one", state: "succeeded", result, error: null }]);
  });

  it("re-sends a final report the server never confirmed after a restart, and prunes it a day after it is confirmed", async () => {
    const rt = await host();
    const unreachable = runner(rt, { send: () => Promise.reject(new Error("server unreachable")) });
    await unreachable.r.receive(command("cmd_lost", "instance.snapshot", A, "snap_lost"));
    expect(journal("cmd_lost")).toMatchObject({ state: "succeeded", confirmed: false });
    await unreachable.r.close();

    const restarted = runner(rt);
    await restarted.r.resendUnconfirmed();
    await until("the final report to be confirmed", () => journal("cmd_lost").confirmed === true);
    expect(finals(restarted.sent)).toEqual([{ id: "cmd_lost", state: "succeeded", result: journal("cmd_lost").result, error: null }]);
    expect(await restarted.r.prune()).toBe(0);

    const dayLater = runner(rt, { now: () => Date.now() + 25 * hour });
    expect(await dayLater.r.prune()).toBe(1);
    expect(existsSync(join(root, "commands", "cmd_lost.json"))).toBe(false);
  });

  it("refuses a command received after its deadline, without touching the instance", async () => {
    const rt = await host();
    const late = command("cmd_late", "instance.snapshot", A, "snap_late", new Date(Date.now() - 1000));
    const { r, sent } = runner(rt);
    await r.receive(late);
    await until("the refusal", () => sent.length > 0);
    expect(sent).toEqual([{ id: "cmd_late", state: "failed", result: null, error: expect.stringMatching(/not started: .*after its deadline/) }]);
    expect(existsSync(join(fakeDir, "snapshots", A, "snap_late"))).toBe(false);
    expect(await stateOf(rt, A)).toBe("running");
  });

  it("reports what the runtime refused as failed, with the runtime's message", async () => {
    const rt = await host();
    const { r, sent } = runner(rt);
    await r.receive(command("cmd_unknown", "instance.restore", A, "snap_never"));
    await rt.stop(B);
    await r.receive(command("cmd_stopped", "instance.snapshot", B, "snap_b"));
    await r.receive({ id: "cmd_odd", kind: "instance.migrate", deadline: new Date().toISOString(), args: {} });
    await until("three final reports", () => finals(sent).length === 3);
    expect(finals(sent)).toEqual([
      { id: "cmd_unknown", state: "failed", result: null, error: expect.stringContaining("no snapshot snap_never") },
      { id: "cmd_stopped", state: "failed", result: null, error: expect.stringContaining("no memory to save") },
      { id: "cmd_odd", state: "failed", result: null, error: expect.stringContaining("malformed command") },
    ]);
  });

  it("runs again, on start, a command the agent died running, whatever its deadline", async () => {
    const rt = await host();
    const died = command("cmd_died", "instance.snapshot", A, "snap_died", new Date(Date.now() - hour));
    mkdirSync(join(root, "commands"), { recursive: true });
    writeFileSync(
      join(root, "commands", "cmd_died.json"),
      JSON.stringify({ command: died, state: "running", result: null, error: null, confirmed: false, startedAt: new Date().toISOString(), finishedAt: null }),
    );
    const { r, sent } = runner(rt);
    await r.recover();
    await r.settled();
    await until("the final report", () => finals(sent).length > 0);
    expect(finals(sent)).toEqual([{ id: "cmd_died", state: "succeeded", result: { sizeBytes: expect.any(Number) }, error: null }]);
    expect(existsSync(join(fakeDir, "snapshots", A, "snap_died"))).toBe(true);
  });

  it("the converger skips an instance a command holds, reports it as it was, and converges it once the command ends", async () => {
    // The fake keeps the domain stopped (saved) for the snapshot's delay, as libvirt does.
    const rt = await host({ delays: { snapshot: 400 } });
    const locks = new InstanceLocks();
    const converger = new Converger(rt, () => {}, locks);
    const before = await converger.report(1);
    const released: string[] = [];
    locks.onCommandRelease((id) => released.push(id));
    const { r, sent } = runner(rt, { locks });

    const snapshotting = r.receive(command("cmd_held", "instance.snapshot", A, "snap_held"));
    await until("the save to stop the domain", async () => (await stateOf(rt, A)) === "stopped", 5000, 5);
    const pauseBoth: NodeSpec = { nodeId: "node_x", generation: 2, runtime: "fake", instances: [spec(A, "paused"), spec(B, "paused")], remove: [] };
    expect(await converger.converge(pauseBoth)).toEqual({ skipped: [A] });
    expect(await stateOf(rt, B)).toBe("paused");
    expect(await stateOf(rt, A)).toBe("stopped"); // untouched: still saved by the command
    const during = await converger.report(2);
    expect(during.instances.find((i) => i.id === A)).toEqual(before.instances.find((i) => i.id === A));
    expect(during.instances.find((i) => i.id === A)?.state).toBe("running");

    await snapshotting;
    expect(released).toEqual([A]); // what makes the agent run another pass
    expect(await stateOf(rt, A)).toBe("running");
    expect(await converger.converge(pauseBoth)).toEqual({ skipped: [] });
    expect(await stateOf(rt, A)).toBe("paused");
    await until("the final report", () => finals(sent).length > 0);
    expect(finals(sent)[0]).toMatchObject({ id: "cmd_held", state: "succeeded" });
  });

  it("retries a report the server fails or never answers until it is taken, without holding up another command", async () => {
    const rt = await host();
    let attempts = 0;
    const sent: CommandReport[] = [];
    const { r } = runner(rt, {
      send: async (report) => {
        if (report.id === "cmd_slow") {
          attempts++;
          if (attempts === 1) return new Promise<void>(() => {}); // no answer at all: the attempt's bound ends it
          if (attempts <= 3) throw new Error("503 from the server");
        }
        sent.push(structuredClone(report));
      },
    });
    await r.receive(command("cmd_slow", "instance.snapshot", A, "snap_slow"));
    await r.receive(command("cmd_other", "instance.snapshot", B, "snap_other"));
    await until("both final reports", () => finals(sent).length === 2, 10_000);
    expect(finals(sent).map((s) => s.id)).toEqual(["cmd_other", "cmd_slow"]);
    expect(attempts).toBeGreaterThanOrEqual(4);
    await until("the slow report to be confirmed", () => journal("cmd_slow").confirmed === true);
  });
});
