import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createFakeRuntime } from "../../agent/runtimes/fake/index.ts";
import { RuntimeError } from "../../agent/runtimes/runtime.ts";
import { instanceSpec } from "../../contracts/host.ts";
import { until } from "../support/fixtures.ts";
import { processesIn } from "../support/pidns.ts";

// A fake host's exec is a tenant's command on the platform's own machine: it must reach nothing of the platform.

const spec = (env: Record<string, string> = {}) =>
  instanceSpec.parse({
    id: "inst_a",
    power: "running",
    vcpus: 1,
    memoryMib: 512,
    diskGib: 1,
    gpus: [],
    image: { url: "https://images.example/debian-12.qcow2", sha256: "ab".repeat(32), format: "qcow2" },
    sshKeys: [],
    userData: null,
    hostname: "guest",
    nic: { bridge: "br-bc", mac: "52:54:00:12:34:56", address: null, prefix: null, gateway: null },
    env,
    network: { egress: "all", allow: [] },
    fromSnapshot: null,
  });

let dir: string;
let outside: string;
let rt: ReturnType<typeof createFakeRuntime>;
const marker = `bc-confined-marker-${process.pid}`;
beforeEach(async () => {
  // The platform's secrets: in its data directory (root's, private) and anywhere else on the machine.
  dir = await mkdtemp(join(tmpdir(), "bc-fake-confined-"));
  outside = await mkdtemp(join(tmpdir(), "bc-outside-"));
  chmodSync(outside, 0o777);
  writeFileSync(join(dir, "seal.key"), "sealed-secret\n", { mode: 0o600 });
  writeFileSync(join(outside, "public.txt"), "world-readable\n", { mode: 0o644 });
  process.env.BC_CONFINED_MARKER = marker;
  rt = createFakeRuntime({ dir });
  await rt.create(spec({ FROM_SPEC: "1" }));
  await rt.start("inst_a");
});
afterEach(async () => {
  delete process.env.BC_CONFINED_MARKER;
  await rt.close();
  for (const d of [dir, outside]) await rm(d, { recursive: true, force: true });
});

const scratch = () => join(dir, "scratch", "inst_a");
async function run(command: string[], over: { stdin?: string; timeoutMs?: number; env?: Record<string, string> } = {}, onOut = () => {}) {
  const out = { stdout: "", stderr: "" };
  const result = await rt.exec("inst_a", { command, env: over.env ?? {}, stdin: over.stdin ?? null, timeoutMs: over.timeoutMs ?? 10_000 }, (s, d) => {
    out[s] += d;
    onOut();
  });
  return { result, ...out };
}
const sh = (script: string, ...args: string[]) => run(["sh", "-c", script, "sh", ...args]);

describe("a fake host's exec is confined", () => {
  it("reads nothing of the platform's files: not its data directory, nor anything outside its own", async () => {
    const tries = [join(dir, "seal.key"), join(outside, "public.txt"), join(dir, "domains", "inst_a.json"), "/etc/hostname"];
    const out = await sh('for f in "$@"; do cat "$f" && echo "READ $f"; done; true', ...tries);
    expect(out.stdout).not.toMatch(/READ|sealed-secret|world-readable|inst_a\.json/);
    expect(out.stderr).toContain("No such file or directory");
  });

  it("sees none of the agent's environment, only PATH and the spec's and the request's variables", async () => {
    expect((await run(["env"], { env: { FROM_REQUEST: "2" } })).stdout.split("\n").sort()).toEqual([
      "",
      "FROM_REQUEST=2",
      "FROM_SPEC=1",
      expect.stringMatching(/^PATH=\/usr/),
    ]);
    // The agent's own environment, through /proc: neither the agent's nor the sandbox's first process holds it.
    const out = await sh(`cat /proc/${process.pid}/environ && echo READ; cat /proc/1/environ; cat /proc/[0-9]*/environ; true`);
    expect(out.stdout).not.toContain("READ");
    expect(out.stdout).not.toContain(marker);
  });

  it("sees only its own processes", async () => {
    const out = await run(["ls", "/proc"]);
    const pids = out.stdout.split("\n").filter((n) => /^\d+$/.test(n));
    expect(pids).not.toContain(String(process.pid));
    expect(pids.length).toBeLessThanOrEqual(4); // bubblewrap's init, ls; nothing else of the machine
  });

  it("runs as an unprivileged user with no capabilities", async () => {
    expect((await run(["id", "-u"])).stdout).not.toBe("0\n");
    const caps = (await run(["grep", "^Cap", "/proc/self/status"])).stdout.trim().split("\n");
    expect(caps).toHaveLength(5);
    for (const line of caps) expect(line).toMatch(/^Cap(Inh|Prm|Eff|Bnd|Amb):\s+0+$/);
  });

  it("writes only its own directory", async () => {
    const name = `bc-escape-${process.pid}`;
    const targets = [join(outside, name), join(dir, name), join("/usr", name), join("/", name)];
    try {
      const out = await sh('for f in "$@"; do echo x > "$f"; done; echo kept > inside', ...targets);
      for (const t of targets) expect(existsSync(t), t).toBe(false);
      expect(out.stderr).toContain("Read-only file system"); // /usr
      expect(readFileSync(join(scratch(), "inside"), "utf8")).toBe("kept\n");
    } finally {
      for (const t of targets) await rm(t, { force: true });
    }
  });

  it("leaves nothing running once its command exits, not even what left its process group", async () => {
    const out = await sh("readlink /proc/self/ns/pid > ns; setsid sleep 30 >/dev/null 2>&1 & echo started");
    expect(out).toMatchObject({ result: { exitCode: 0, timedOut: false }, stdout: "started\n" });
    const ns = readFileSync(join(scratch(), "ns"), "utf8").trim();
    await until("nothing of the exec to be left", () => processesIn(ns).length === 0, 5000, 10);
  });
});

describe("a confined exec still behaves as a guest's command", () => {
  it("runs scripts with stdin, env and exit codes; a missing or unrunnable program is 127 or 126", async () => {
    const out = await run(["sh", "-c", 'read l; echo "$l/$FROM_SPEC/$X" >&2; exit 9'], { stdin: "typed\n", env: { X: "x" } });
    expect(out).toEqual({ result: { exitCode: 9, signal: null, timedOut: false }, stdout: "", stderr: "typed/1/x\n" });
    expect(await run(["no-such-program-here"])).toEqual({
      result: { exitCode: 127, signal: null, timedOut: false },
      stdout: "",
      stderr: "no-such-program-here: command not found\n",
    });
    mkdirSync(join(scratch(), "adir"));
    expect(await run(["./adir"])).toMatchObject({ result: { exitCode: 126 }, stderr: "./adir: permission denied\n" });
    // A command that exits 127 by itself is its own outcome, with its own words.
    expect(await sh("echo mine >&2; exit 127")).toMatchObject({ result: { exitCode: 127 }, stderr: "mine\n" });
  });

  it("is frozen while its domain is paused and runs on when resumed", async () => {
    let up = false;
    const waiting = run(
      ["sh", "-c", "readlink /proc/self/ns/pid > ns; echo up; while [ ! -f go ]; do sleep 0.01; done; echo went"],
      { timeoutMs: 30_000 },
      () => {
        up = true;
      },
    );
    await until("the command to run", () => up, 5000, 5);
    const ns = readFileSync(join(scratch(), "ns"), "utf8").trim();
    await rt.pause("inst_a");
    await until("its processes to be stopped", () => processesIn(ns).every((p) => p.state === "T"), 5000, 10);
    await rt.resume("inst_a");
    await until("its processes to run again", () => processesIn(ns).every((p) => p.state !== "T"), 5000, 10);
    writeFileSync(join(scratch(), "go"), "");
    expect(await waiting).toMatchObject({ result: { exitCode: 0, timedOut: false }, stdout: "up\nwent\n" });
  });

  it("is killed whole at its timeout", async () => {
    const out = await run(["sh", "-c", "readlink /proc/self/ns/pid > ns; echo started; sleep 30 & wait"], { timeoutMs: 500 });
    expect(out).toMatchObject({ result: { exitCode: null, signal: "SIGKILL", timedOut: true }, stdout: "started\n" });
    const ns = readFileSync(join(scratch(), "ns"), "utf8").trim();
    await until("nothing of the exec to be left", () => processesIn(ns).length === 0, 5000, 10);
  });
});

describe("a fake host without bubblewrap", () => {
  it("refuses exec as a guest without an agent, naming what to install, and runs nothing", async () => {
    // The same host restarted on a machine where bwrap is not installed.
    await rt.close();
    rt = createFakeRuntime({ dir, bwrap: join(outside, "bwrap") });
    const err = await rt
      .exec("inst_a", { command: ["touch", "ran"], env: {}, stdin: null, timeoutMs: 5000 }, () => {})
      .then(
        () => null,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(RuntimeError);
    expect(err).toMatchObject({ retryable: false, message: expect.stringMatching(/guest agent.*bubblewrap/) });
    expect(existsSync(join(scratch(), "ran"))).toBe(false);
  });

  it("refuses exec, with bubblewrap's words, where bubblewrap cannot confine", async () => {
    // Stands in for a bwrap the kernel refuses namespaces to: it says why and exits 1 before running anything.
    const refused = join(outside, "bwrap");
    writeFileSync(refused, "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n", { mode: 0o755 });
    await rt.close();
    rt = createFakeRuntime({ dir, bwrap: refused });
    const err = await rt
      .exec("inst_a", { command: ["true"], env: {}, stdin: null, timeoutMs: 5000 }, () => {})
      .then(
        () => null,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(RuntimeError);
    expect(err).toMatchObject({ retryable: false, message: expect.stringMatching(/guest agent could not confine.*No permissions to create new namespace/) });
  });
});
