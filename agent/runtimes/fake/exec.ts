import { type ChildProcess, spawn } from "node:child_process";
import type { ExecRequest, ExecResult } from "../../../contracts/host.ts";
import { RuntimeError } from "../runtime.ts";

/** What a guest's exec gets as its environment before the spec's and the request's variables. */
export const GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

export type OnOutput = (stream: "stdout" | "stderr", data: string) => void;

/**
 * The fake's "guest processes": each exec is a real child process in a process group of its own, tracked by
 * domain so what happens to the domain happens to them (a stop or a removal kills them, a pause freezes them).
 * Nothing an exec starts outlives it: when the command's own process exits, whatever it left running in its
 * group is killed, so a test run leaves no strays behind (a real guest would keep them; the fake has no guest).
 */
export class GuestProcesses {
  private readonly groups = new Map<string, Set<ChildProcess>>();

  /**
   * Run `req.command` with exactly `env`, in `cwd`, no shell. A program that cannot be found or run is answered
   * as a shell would (exit 127 or 126, a line on stderr), since in a guest that is the command's outcome, not
   * the host's failure; any other spawn failure is a retryable RuntimeError (the host ran out of something).
   */
  run(id: string, cwd: string, env: Record<string, string>, req: Omit<ExecRequest, "instanceId">, onOutput: OnOutput): Promise<ExecResult> {
    const [program, ...args] = req.command as [string, ...string[]];
    // What no process can be given: refused as a bad request, the same on any host.
    const bad = Object.keys(env).find((k) => k === "" || k.includes("=") || k.includes("\0") || env[k]?.includes("\0"));
    if (bad !== undefined) return Promise.reject(new RuntimeError(`exec: environment variable '${bad}' cannot be passed to a process`, false));
    if (req.command.some((a) => a.includes("\0"))) return Promise.reject(new RuntimeError("exec: an argument holds a NUL byte", false));
    const child = spawn(program, args, {
      cwd,
      env,
      // A session of its own: the whole group can be signalled, and the agent's terminal signals do not reach it.
      detached: true,
      shell: false,
      stdio: [req.stdin === null ? "ignore" : "pipe", "pipe", "pipe"],
      windowsHide: true,
    });
    return new Promise<ExecResult>((resolve, reject) => {
      let timedOut = false;
      let exited: { code: number | null; signal: NodeJS.Signals | null } | null = null;
      const timer = setTimeout(() => {
        timedOut = exited === null;
        signalGroup(child, "SIGKILL");
        // The command's process had already exited, but something kept its output open past it.
        if (exited) for (const s of [child.stdout, child.stderr]) s?.destroy();
      }, req.timeoutMs);
      const finish = (result: ExecResult | Error) => {
        clearTimeout(timer);
        this.groups.get(id)?.delete(child);
        if (this.groups.get(id)?.size === 0) this.groups.delete(id);
        if (result instanceof Error) reject(result);
        else resolve(result);
      };

      child.once("error", (err: NodeJS.ErrnoException) => {
        if (child.pid !== undefined) return; // a signal to an exited process, say: the exit still comes
        const shellCode = err.code === "ENOENT" ? 127 : err.code === "EACCES" || err.code === "ENOEXEC" ? 126 : null;
        if (shellCode === null) return finish(new RuntimeError(`exec ${program}: ${err.message}`, true));
        onOutput("stderr", `${program}: ${shellCode === 127 ? "command not found" : "permission denied"}\n`);
        finish({ exitCode: shellCode, signal: null, timedOut: false });
      });
      if (child.pid === undefined) return;

      const set = this.groups.get(id) ?? new Set();
      set.add(child);
      this.groups.set(id, set);
      if (child.stdin) {
        // The command may exit without reading its input: that is its business, not an error of ours.
        child.stdin.on("error", () => {});
        child.stdin.end(req.stdin ?? "");
      }
      for (const name of ["stdout", "stderr"] as const) {
        const stream = child[name];
        // Decodes across chunk boundaries: a character split between two reads is never mangled.
        stream?.setEncoding("utf8");
        stream?.on("data", (data: string) => onOutput(name, data));
      }
      child.once("exit", (code, signal) => {
        exited = { code, signal };
        signalGroup(child, "SIGKILL");
      });
      child.once("close", () => {
        const { code, signal } = exited ?? { code: null, signal: null };
        finish(timedOut ? { exitCode: null, signal: "SIGKILL", timedOut: true } : { exitCode: code, signal, timedOut: false });
      });
    });
  }

  /** Send `signal` to every exec of domain `id` (SIGKILL: the domain went away; SIGSTOP/SIGCONT: paused, resumed). */
  signal(id: string, signal: NodeJS.Signals): void {
    for (const child of this.groups.get(id) ?? []) signalGroup(child, signal);
  }

  /** Kill every exec of every domain: the fake's guests do not outlive it. */
  killAll(): void {
    for (const id of this.groups.keys()) this.signal(id, "SIGKILL");
  }
}

function signalGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // ESRCH: the group is empty already.
  }
}
