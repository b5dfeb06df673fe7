import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ExecOutput } from "../../agent/commands/exec-output.ts";
import { CommandRunner, type CommandRunnerOptions, EXEC_INTERRUPTED } from "../../agent/commands/index.ts";
import { Converger } from "../../agent/converge.ts";
import { InstanceLocks } from "../../agent/locks.ts";
import { createFakeRuntime, type FakeOptions, injectFailure } from "../../agent/runtimes/fake/index.ts";
import type { Runtime } from "../../agent/runtimes/runtime.ts";
import {
  type CommandReport,
  type ExecChunk,
  type ExecRequest,
  type HostCommand,
  type InstanceSpec,
  instanceSpec,
  type NodeSpec,
} from "../../contracts/host.ts";
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
    env: {},
    network: { egress: "all", allow: [] },
    fromSnapshot: null,
  });
}

const command = (
  id: string,
  kind: "instance.snapshot" | "instance.restore",
  instanceId: string,
  snapshotId: string,
  deadline = new Date(Date.now() + hour),
): HostCommand => ({
  id,
  kind,
  deadline: deadline.toISOString(),
  args: { instanceId, snapshotId },
});

const exec = (id: string, instanceId: string, argv: string[], over: Partial<ExecRequest> = {}): HostCommand => ({
  id,
  kind: "instance.exec",
  deadline: new Date(Date.now() + hour).toISOString(),
  args: { instanceId, command: argv, env: {}, stdin: null, timeoutMs: 30_000, ...over },
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
  /** Output the server took, as it took it. */
  const output: { id: string; chunks: ExecChunk[] }[] = [];
  const r = new CommandRunner({
    stateDir: root,
    runtime: rt,
    locks: new InstanceLocks(),
    send: async (report) => void sent.push(structuredClone(report)),
    sendOutput: async (id, chunks) => void output.push({ id, chunks: structuredClone(chunks) }),
    retry: { attemptMs: 200, firstMs: 10, maxMs: 40 },
    ...o,
  });
  open.push(r);
  return { r, sent, output };
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
    expect(sent).toEqual([
      { id: "cmd_late", state: "failed", result: null, error: expect.stringMatching(/not started: .*after its deadline/), code: "expired" },
    ]);
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
      { id: "cmd_unknown", state: "failed", result: null, error: expect.stringContaining("no snapshot snap_never"), code: "not-found" },
      { id: "cmd_stopped", state: "failed", result: null, error: expect.stringContaining("no memory to save"), code: "not-running" },
      { id: "cmd_odd", state: "failed", result: null, error: expect.stringContaining("malformed command"), code: "invalid" },
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

  it("reports a domain a command the agent died running holds as it was when the command first began", async () => {
    const rt = await host({ delays: { snapshot: 400 } });
    const locks = new InstanceLocks();
    const converger = new Converger(rt, () => {}, locks);
    const before = (await converger.report(1)).instances.find((i) => i.id === A);
    // What a crash in the middle of a save leaves: the journal (with the domain as the command found it) and a
    // domain that no longer looks as it did (a save leaves it off; paused here, which a snapshot still takes).
    const died = command("cmd_pinned", "instance.snapshot", A, "snap_pinned");
    mkdirSync(join(root, "commands"), { recursive: true });
    const { addresses: _, ...status } = before as NonNullable<typeof before>;
    writeFileSync(
      join(root, "commands", "cmd_pinned.json"),
      JSON.stringify({
        command: died,
        state: "running",
        result: null,
        error: null,
        confirmed: false,
        startedAt: new Date().toISOString(),
        finishedAt: null,
        pinned: { ...status, addresses: before?.addresses ?? [] },
      }),
    );
    await rt.pause(A);
    const { r, sent } = runner(rt, { locks });
    await r.recover();
    // Held from here until the command ends, and shown running, not as the runtime sees it.
    const during = (await converger.report(2)).instances.find((i) => i.id === A);
    expect(during?.state).toBe("running");
    await r.settled();
    await until("the final report", () => finals(sent).length > 0);
    expect(finals(sent)[0]).toMatchObject({ id: "cmd_pinned", state: "succeeded" });
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

  it("resumes at once: the instance is held from receipt, one final report, no journal, and again is harmless", async () => {
    const rt = await host({ delays: { resume: 200 } });
    await rt.pause(A);
    const locks = new InstanceLocks();
    const converger = new Converger(rt, () => {}, locks);
    const { r, sent } = runner(rt, { locks });
    const resume = (id: string, deadline = new Date(Date.now() + hour)): HostCommand => ({
      id,
      kind: "instance.resume",
      deadline: deadline.toISOString(),
      args: { instanceId: A },
    });

    const resuming = r.receive(resume("cmd_resume"));
    // The claim's spec arrives right behind the command: the converger must leave the instance to it.
    const claimed: NodeSpec = { nodeId: "node_x", generation: 3, runtime: "fake", instances: [spec(A, "running"), spec(B)], remove: [] };
    expect(await converger.converge(claimed)).toEqual({ skipped: [A] });
    await resuming;
    expect(await stateOf(rt, A)).toBe("running");
    await until("the final report", () => finals(sent).length === 1);
    expect(sent).toEqual([{ id: "cmd_resume", state: "succeeded", result: {}, error: null, power: { kind: "instance.resume", instanceId: A } }]);
    expect(existsSync(join(root, "commands", "cmd_resume.json"))).toBe(false);

    await r.receive(resume("cmd_resume")); // delivered again after a reconnect: resumed again, reported again
    expect(await stateOf(rt, A)).toBe("running");
    await until("the second report", () => finals(sent).length === 2);
    await r.receive(resume("cmd_late", new Date(Date.now() - 1000)));
    await until("the late one's report", () => finals(sent).length === 3);
    expect(finals(sent)[2]).toMatchObject({ id: "cmd_late", state: "failed", error: expect.stringContaining("deadline") });
  });

  it("pauses at once the same way, ahead of the spec that says so", async () => {
    const rt = await host({ delays: { pause: 200 } });
    const locks = new InstanceLocks();
    const converger = new Converger(rt, () => {}, locks);
    const { r, sent } = runner(rt, { locks });
    const pausing = r.receive({ id: "cmd_pause", kind: "instance.pause", deadline: new Date(Date.now() + hour).toISOString(), args: { instanceId: A } });
    const asked: NodeSpec = { nodeId: "node_x", generation: 4, runtime: "fake", instances: [spec(A, "paused"), spec(B)], remove: [] };
    expect(await converger.converge(asked)).toEqual({ skipped: [A] });
    await pausing;
    expect(await stateOf(rt, A)).toBe("paused");
    await until("the final report", () => finals(sent).length === 1);
    expect(sent).toEqual([{ id: "cmd_pause", state: "succeeded", result: {}, error: null, power: { kind: "instance.pause", instanceId: A } }]);
    expect(existsSync(join(root, "commands", "cmd_pause.json"))).toBe(false);
  });

  it("owes a pass after a pause or resume only where a pass skipped its instance meanwhile; after a snapshot always", async () => {
    const rt = await host({ delays: { resume: 200, pause: 200 } });
    await rt.pause(A);
    const locks = new InstanceLocks();
    const converger = new Converger(rt, () => {}, locks);
    // What the agent does on a release (agent/index.ts): a pass where this says so.
    const owed: [string, boolean][] = [];
    locks.onCommandRelease((id, quiet) => owed.push([id, converger.takeHeldBack(id) || !quiet]));
    const { r } = runner(rt, { locks });
    const deadline = new Date(Date.now() + hour).toISOString();
    const resuming = r.receive({ id: "cmd_r", kind: "instance.resume", deadline, args: { instanceId: A } });
    expect(await converger.converge({ nodeId: "node_x", generation: 3, runtime: "fake", instances: [spec(A), spec(B)], remove: [] })).toEqual({ skipped: [A] });
    await resuming;
    await r.receive({ id: "cmd_p", kind: "instance.pause", deadline, args: { instanceId: A } });
    await r.receive(command("cmd_s", "instance.snapshot", B, "snap_b"));
    expect(owed).toEqual([
      [A, true],
      [A, false],
      [B, true],
    ]);
  });

  it("leaves a paused or resumed instance alone in passes on a spec older than the command, until the spec catches up", async () => {
    const rt = await host();
    const locks = new InstanceLocks();
    const converger = new Converger(rt, () => {}, locks);
    const { r } = runner(rt, { locks, onPower: (id, generation) => converger.powerAhead(id, generation) });
    const power = (id: string, kind: "instance.pause" | "instance.resume", generation: number): HostCommand => ({
      id,
      kind,
      deadline: new Date(Date.now() + hour).toISOString(),
      args: { instanceId: A, generation },
    });
    const at = (generation: number, a: InstanceSpec["power"]): NodeSpec => ({
      nodeId: "node_x",
      generation,
      runtime: "fake",
      instances: [spec(A, a), spec(B)],
      remove: [],
    });
    // Paused by generation 6's command while the host holds generation 5 (running): the pass its release sets off
    // runs on 5, and must not resume the guest.
    await r.receive(power("cmd_p", "instance.pause", 6));
    await converger.converge(at(5, "running"));
    expect(await stateOf(rt, A)).toBe("paused");
    await converger.converge(at(6, "paused"));
    expect(await stateOf(rt, A)).toBe("paused");
    // Resumed by 8's command; 7 (paused) is older still.
    await r.receive(power("cmd_r", "instance.resume", 8));
    await converger.converge(at(7, "paused"));
    expect(await stateOf(rt, A)).toBe("running");
    // Once the spec has caught up it rules again: a later spec that says paused is carried out.
    await converger.converge(at(8, "running"));
    await converger.converge(at(9, "paused"));
    expect(await stateOf(rt, A)).toBe("paused");
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

describe("exec commands", () => {
  const scratch = (id: string) => join(fakeDir, "scratch", id);
  const text = (chunks: ExecChunk[], stream: ExecChunk["stream"]) =>
    chunks
      .filter((c) => c.stream === stream)
      .map((c) => c.data)
      .join("");

  it("delivers output in seq order, every chunk before the final report, and the exec result", async () => {
    const rt = await host();
    // One timeline of what the server got: a slow server makes output pile up between deliveries.
    const timeline: ({ report: CommandReport } | { chunks: ExecChunk[] })[] = [];
    const { r } = runner(rt, {
      send: async (report) => void timeline.push({ report: structuredClone(report) }),
      sendOutput: async (_, chunks) => {
        await new Promise((res) => setTimeout(res, 5));
        timeline.push({ chunks: structuredClone(chunks) });
      },
    });
    const script = 'for i in $(seq 1 200); do echo "out $i"; echo "err $i" >&2; done; printf tail; exit 3';
    await r.receive(exec("cmd_exec", A, ["sh", "-c", script], { env: { X: "1" } }));
    await until("the final report", () => timeline.some((t) => "report" in t && t.report.state !== "running"));

    const chunks = timeline.flatMap((t) => ("chunks" in t ? t.chunks : []));
    expect(chunks.map((c) => c.seq)).toEqual(chunks.map((_, i) => i));
    expect(text(chunks, "stdout")).toBe(`${Array.from({ length: 200 }, (_, i) => `out ${i + 1}\n`).join("")}tail`);
    expect(text(chunks, "stderr")).toBe(Array.from({ length: 200 }, (_, i) => `err ${i + 1}\n`).join(""));
    const finalAt = timeline.findIndex((t) => "report" in t && t.report.state !== "running");
    expect(timeline.slice(finalAt + 1).some((t) => "chunks" in t)).toBe(false);
    expect(timeline[finalAt]).toEqual({
      report: { id: "cmd_exec", state: "succeeded", result: { exitCode: 3, signal: null, timedOut: false }, error: null, bulk: true },
    });
    expect(journal("cmd_exec")).toMatchObject({ state: "succeeded", result: { exitCode: 3 } });
  });

  it("runs an exec once per id: delivered twice at once, again later, or again to a new runner", async () => {
    const rt = await host();
    const once = exec("cmd_once", A, ["sh", "-c", "echo ran >> runs; cat runs"]);
    const first = runner(rt);
    await Promise.all([first.r.receive(once), first.r.receive(once)]);
    await first.r.receive(once);
    await until("the final report to be confirmed", () => journal("cmd_once").confirmed === true);
    expect(readFileSync(join(scratch(A), "runs"), "utf8")).toBe("ran\n");
    expect(
      text(
        first.output.flatMap((o) => o.chunks),
        "stdout",
      ),
    ).toBe("ran\n");
    await first.r.close();

    const second = runner(rt);
    await second.r.receive(once);
    await until("the final report again", () => second.sent.length > 0);
    expect(second.sent).toEqual([{ id: "cmd_once", state: "succeeded", result: { exitCode: 0, signal: null, timedOut: false }, error: null, bulk: true }]);
    expect(second.output).toEqual([]);
    expect(readFileSync(join(scratch(A), "runs"), "utf8")).toBe("ran\n");
  });

  it("reports an exec the agent was running when it went away as failed, and never runs it again", async () => {
    const rt = await host();
    const long = exec("cmd_long", A, ["sh", "-c", "echo ran >> runs; echo started; exec sleep 60"], { timeoutMs: 120_000 });
    const before = runner(rt);
    void before.r.receive(long);
    await until("the command's output", () => before.output.length > 0);
    await before.r.close(); // the agent stops: the exec is left, journalled running
    expect(journal("cmd_long")).toMatchObject({ state: "running" });
    expect(finals(before.sent)).toEqual([]);

    const after = runner(rt);
    await after.r.recover();
    await until("the final report to be confirmed", () => journal("cmd_long").confirmed === true);
    expect(finals(after.sent)).toEqual([{ id: "cmd_long", state: "failed", result: null, error: EXEC_INTERRUPTED, code: "internal", bulk: true }]);
    await after.r.receive(long); // delivered again after the restart: answered from the journal
    await until("the report again", () => finals(after.sent).length > 1);
    expect(finals(after.sent)[1]).toEqual(finals(after.sent)[0]);
    expect(readFileSync(join(scratch(A), "runs"), "utf8")).toBe("ran\n");
  });

  it("fails, without running it, an exec journalled running that arrives before recovery", async () => {
    const rt = await host();
    const died = exec("cmd_died", A, ["sh", "-c", "echo ran >> runs"]);
    mkdirSync(join(root, "commands"), { recursive: true });
    writeFileSync(
      join(root, "commands", "cmd_died.json"),
      JSON.stringify({ command: died, state: "running", result: null, error: null, confirmed: false, startedAt: new Date().toISOString(), finishedAt: null }),
    );
    const { r, sent } = runner(rt);
    await r.receive(died);
    await until("the final report", () => finals(sent).length > 0);
    expect(finals(sent)).toEqual([{ id: "cmd_died", state: "failed", result: null, error: EXEC_INTERRUPTED, code: "internal", bulk: true }]);
    expect(existsSync(join(scratch(A), "runs"))).toBe(false);
  });

  it("retries output the server failed to take, keeping seq order, before the final report", async () => {
    const rt = await host();
    let attempts = 0;
    const taken: ExecChunk[] = [];
    const { r, sent } = runner(rt, {
      sendOutput: async (_, chunks) => {
        attempts++;
        if (attempts === 1) return new Promise<void>(() => {}); // no answer: the attempt's bound ends it
        if (attempts <= 3) throw new Error("503 from the server");
        taken.push(...structuredClone(chunks));
      },
    });
    await r.receive(exec("cmd_retry", A, ["sh", "-c", "echo one; echo two >&2; echo three"]));
    await until("the final report", () => finals(sent).length > 0, 10_000);
    expect(attempts).toBeGreaterThanOrEqual(4);
    expect(taken.map((c) => c.seq)).toEqual(taken.map((_, i) => i));
    expect(text(taken, "stdout")).toBe("one\nthree\n");
    expect(text(taken, "stderr")).toBe("two\n");
    expect(finals(sent)).toEqual([{ id: "cmd_retry", state: "succeeded", result: { exitCode: 0, signal: null, timedOut: false }, error: null, bulk: true }]);
  });

  it("runs beside convergence and beside other execs of the same instance, without holding its lock", async () => {
    const rt = await host();
    const locks = new InstanceLocks();
    const converger = new Converger(rt, () => {}, locks);
    const { r, sent, output } = runner(rt, { locks });
    const waiting = r.receive(exec("cmd_wait", A, ["sh", "-c", "echo waiting; while [ ! -f go ]; do sleep 0.01; done; echo went"], { timeoutMs: 10_000 }));
    await until("the first exec to run", () => output.some((o) => o.id === "cmd_wait"));
    const steady: NodeSpec = { nodeId: "node_x", generation: 2, runtime: "fake", instances: [spec(A), spec(B)], remove: [] };
    expect(await converger.converge(steady)).toEqual({ skipped: [] });
    await r.receive(exec("cmd_go", A, ["touch", "go"]));
    await waiting;
    await until("both final reports", () => finals(sent).length === 2);
    // Which final report goes first is a race between two processes exiting; both must succeed.
    expect(
      finals(sent)
        .map((s) => [s.id, s.state])
        .sort(),
    ).toEqual([
      ["cmd_go", "succeeded"],
      ["cmd_wait", "succeeded"],
    ]);
    expect(
      text(
        output.filter((o) => o.id === "cmd_wait").flatMap((o) => o.chunks),
        "stdout",
      ),
    ).toBe("waiting\nwent\n");
  });

  it("reports what the runtime refused as failed, and a timeout as a result", async () => {
    const rt = await host();
    await rt.pause(B);
    const { r, sent } = runner(rt);
    await r.receive(exec("cmd_paused", B, ["true"]));
    await r.receive(exec("cmd_slow", A, ["sleep", "30"], { timeoutMs: 200 }));
    await until("two final reports", () => finals(sent).length === 2);
    expect(finals(sent)).toEqual([
      { id: "cmd_paused", state: "failed", result: null, error: expect.stringContaining("exec needs it running"), code: "not-running", bulk: true },
      { id: "cmd_slow", state: "succeeded", result: { exitCode: null, signal: "SIGKILL", timedOut: true }, error: null, bulk: true },
    ]);
  });
});

describe("exec output batching", () => {
  function outlet(o: Partial<ConstructorParameters<typeof ExecOutput>[0]> = {}) {
    const batches: ExecChunk[][] = [];
    const stop = new AbortController();
    const out = new ExecOutput({
      attempt: async (chunks) => void batches.push(structuredClone(chunks)),
      backoff: async () => {},
      stop: stop.signal,
      ...o,
    });
    return { out, batches, stop };
  }

  it("sends what arrives close together as one batch, a stream's run as one chunk, and splits what exceeds a batch", async () => {
    const { out, batches } = outlet({ flushMs: 10_000, batchChars: 10 });
    out.push("stdout", "ab");
    out.push("stdout", "cd");
    out.push("stderr", "E");
    out.push("stdout", "fg");
    expect(batches).toEqual([]); // still gathering
    out.push("stdout", "h😀ijklmnop"); // over the batch size: goes without waiting, split between characters
    await until("a full batch", () => batches.length > 0, 5000, 5);
    await out.end();
    const chunks = batches.flat();
    expect(chunks.map((c) => c.seq)).toEqual(chunks.map((_, i) => i));
    expect(batches[0]).toEqual([
      { seq: 0, stream: "stdout", data: "abcd" },
      { seq: 1, stream: "stderr", data: "E" },
      { seq: 2, stream: "stdout", data: "fg" },
    ]);
    expect(chunks.every((c) => c.data.length <= 10 && !/[\ud800-\udbff]$/.test(c.data))).toBe(true);
    expect(chunks.map((c) => c.data).join("")).toBe("abcdEfgh😀ijklmnop");
  });

  it("puts no more chunks in a batch than the server takes in one call", async () => {
    const { out, batches } = outlet({ flushMs: 10_000, batchChunks: 2 });
    for (let i = 0; i < 5; i++) out.push(i % 2 ? "stderr" : "stdout", String(i));
    await out.end();
    expect(batches.map((b) => b.map((c) => `${c.seq}:${c.data}`))).toEqual([["0:0", "1:1"], ["2:2", "3:3"], ["4:4"]]);
  });

  it("holds a bounded amount while the server does not take it, and says how much it dropped", async () => {
    let release = () => {};
    const held = new Promise<void>((r) => (release = r));
    const batches: ExecChunk[][] = [];
    const { out } = outlet({
      flushMs: 0,
      batchChars: 4,
      maxPendingChars: 8,
      attempt: async (chunks) => {
        await held;
        batches.push(chunks);
      },
    });
    out.push("stdout", "1234"); // taken at once, then stuck in the slow attempt
    await new Promise((r) => setImmediate(r));
    out.push("stdout", "5678");
    out.push("stdout", "abcd");
    out.push("stdout", "lost");
    out.push("stdout", "gone");
    release();
    await out.end();
    const data = batches.flat().map((c) => c.data);
    expect(data.slice(0, 3)).toEqual(["1234", "5678", "abcd"]);
    expect(data.slice(3).join("")).toContain("[8 characters of output dropped here");
  });

  it("gives up when stopped: end rejects and nothing more is sent", async () => {
    const { out, stop } = outlet({ attempt: () => Promise.reject(new Error("down")), backoff: () => new Promise((r) => setTimeout(r, 5)) });
    out.push("stdout", "x");
    const ending = out.end();
    stop.abort();
    await expect(ending).rejects.toThrow();
  });
});
