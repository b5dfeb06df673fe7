import { realpathSync } from "node:fs";
import type { ExecRequest, ExecResult } from "../../../contracts/host.ts";
import { RuntimeError } from "../runtime.ts";
import { confinedArgs, findBwrap, NO_BWRAP } from "./confine.ts";
import { type Spawned, Spawner } from "./spawner-client.ts";

/** What a guest's exec gets as its environment before the spec's and the request's variables. */
export const GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

export type OnOutput = (stream: "stdout" | "stderr", data: string) => void;

/**
 * The fake's "guest processes": each exec is a real child process, confined by bubblewrap (./confine.ts), in a
 * process group of its own, tracked by domain so what happens to the domain happens to them (a stop or a removal
 * kills them, a pause freezes them). Nothing an exec starts outlives it: when the command's own process exits,
 * its pid namespace ends, and with it whatever it left running (a real guest would keep them; the fake has no
 * guest). A command killed by a signal shows as exit 128+n, as bubblewrap (and a shell) report it.
 */
export class GuestProcesses {
  private readonly groups = new Map<string, Set<Spawned>>();
  private readonly spawner = new Spawner();

  /** `bwrap`: the bubblewrap binary to confine with; by default the system's, looked up at each exec. */
  constructor(private readonly bwrap?: string) {}

  /**
   * Run `req.command` with exactly `env`, in `cwd`, confined, no shell of ours. A program that cannot be found or
   * run is answered as a shell would (exit 127 or 126, a line on stderr), since in a guest that is the command's
   * outcome, not the host's failure. Without bubblewrap, or where it cannot confine, nothing runs: a RuntimeError
   * that is not retried (never unconfined); any other spawn failure is retryable (the host ran out of something).
   */
  run(id: string, cwd: string, env: Record<string, string>, req: Omit<ExecRequest, "instanceId">, onOutput: OnOutput): Promise<ExecResult> {
    const program = req.command[0] as string;
    // What no process can be given: refused as a bad request, the same on any host.
    const bad = Object.keys(env).find((k) => k === "" || k.includes("=") || k.includes("\0") || env[k]?.includes("\0"));
    if (bad !== undefined) return Promise.reject(new RuntimeError(`exec: environment variable '${bad}' cannot be passed to a process`, false, "invalid"));
    if (req.command.some((a) => a.includes("\0"))) return Promise.reject(new RuntimeError("exec: an argument holds a NUL byte", false, "invalid"));
    const bwrap = this.bwrap ?? findBwrap();
    if (bwrap === null) return Promise.reject(new RuntimeError(`${id}: ${NO_BWRAP}`, false, "unsupported"));
    const child = this.spawner.spawn(bwrap, confinedArgs(realpathSync(cwd), env, req.command), req.stdin);
    return new Promise<ExecResult>((resolve, reject) => {
      let timedOut = false;
      let exited: { code: number | null; signal: NodeJS.Signals | null } | null = null;
      // Until the command runs, stderr is held: if it never does, what is there is the shell's or bwrap's, not its.
      let status: string | null = null;
      let said = "";
      let held = "";
      const timer = setTimeout(() => {
        timedOut = exited === null;
        signalGroup(child.pid, "SIGKILL");
        // The command's process had already exited, but something kept its output open past it.
        if (exited) child.destroyOutput();
      }, req.timeoutMs);
      const finish = (result: ExecResult | Error) => {
        clearTimeout(timer);
        this.groups.get(id)?.delete(child);
        if (this.groups.get(id)?.size === 0) this.groups.delete(id);
        if (result instanceof Error) reject(result);
        else resolve(result);
      };
      child.on("error", (code, message) => {
        if (code === "ENOENT" || code === "EACCES") return finish(new RuntimeError(`${id}: ${NO_BWRAP}`, false, "unsupported"));
        finish(new RuntimeError(`exec ${program}: ${message}`, true));
      });
      child.on("spawn", () => {
        const set = this.groups.get(id) ?? new Set();
        set.add(child);
        this.groups.set(id, set);
      });
      child.on("data", (fd, data) => {
        if (fd === 3) said = (said + data).slice(0, 16);
        else if (fd === 2 && status !== "s") held += data;
        else onOutput(fd === 1 ? "stdout" : "stderr", data);
      });
      // fd 3 says whether the command started; its end comes before the command's close.
      child.on("end", (fd) => {
        if (fd !== 3 || status !== null) return;
        status = said.trim();
        if (status === "s" && held) onOutput("stderr", held);
      });
      child.on("exit", (code, signal) => {
        exited = { code, signal };
        signalGroup(child.pid, "SIGKILL");
      });
      child.on("close", () => {
        const { code, signal } = exited ?? { code: null, signal: null };
        if (timedOut) return finish({ exitCode: null, signal: "SIGKILL", timedOut: true });
        // Never started, and not for a kill of ours: bubblewrap could not confine it on this machine.
        if (!status && signal === null)
          return finish(
            new RuntimeError(
              `${id}: this fake host's guest agent could not confine the command: ${held.trim() || `bwrap exited ${code}`}`,
              false,
              "unsupported",
            ),
          );
        // The wrapper's exec failed: its shell's words are not the guest's.
        const failed = /^s(\d+)$/.exec(status ?? "");
        if (failed) {
          const shellCode = Number(failed[1]);
          if (shellCode === 127 || shellCode === 126) onOutput("stderr", `${program}: ${shellCode === 127 ? "command not found" : "permission denied"}\n`);
          else if (held) onOutput("stderr", held);
          return finish({ exitCode: shellCode, signal: null, timedOut: false });
        }
        finish({ exitCode: code, signal, timedOut: false });
      });
    });
  }

  /** Send `signal` to every exec of domain `id` (SIGKILL: the domain went away; SIGSTOP/SIGCONT: paused, resumed). */
  signal(id: string, signal: NodeJS.Signals): void {
    for (const child of this.groups.get(id) ?? []) signalGroup(child.pid, signal);
  }

  /** Kill every exec of every domain: the fake's guests do not outlive it (nor does its spawner). */
  killAll(): void {
    for (const id of this.groups.keys()) this.signal(id, "SIGKILL");
    this.spawner.close();
  }
}

function signalGroup(pid: number | undefined, signal: NodeJS.Signals): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, signal);
  } catch {
    // ESRCH: the group is empty already.
  }
}
