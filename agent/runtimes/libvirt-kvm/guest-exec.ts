import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { ExecRequest, ExecResult } from "../../../contracts/host.ts";
import { RuntimeError } from "../runtime.ts";
import { LibvirtCallError } from "./rpc.ts";

/**
 * A command run in a guest through the QEMU guest agent (qemu-ga), as `Runtime.exec` wants it.
 *
 * The output does not come back through guest-exec's capture-output: qemu-ga returns it only once the process
 * has exited, libvirt drops a reply over ~4 MiB (the result is lost) and a reply over 10 MiB kills libvirt's
 * agent connection for that domain until it restarts (measured with libvirt 9.0 and qemu-ga 7.2). So the
 * command writes into two guest files that this side opened first (guest-file-open) and reads from as it runs
 * (guest-file-read, 1 MiB at a time): output streams in order per stream, with no size limit. /bin/sh in the
 * guest points the command's stdout and stderr at the files, unlinks them (the open handles keep them readable,
 * and nothing is left behind however the command ends) and execs the command in a session of its own, so its
 * pid is the one qemu-ga reports and a timeout kills its whole process group. What the guest needs: qemu-ga
 * on the virtio port org.qemu.guest_agent.0 (Debian's and Ubuntu's qemu-guest-agent package), /bin/sh and a
 * writable /tmp.
 */

/** Sends one agent command (JSON) to the domain and returns its parsed reply's `return`. */
export type AgentCall = (command: { execute: string; arguments?: Record<string, unknown> }) => Promise<unknown>;

export interface GuestExecOptions {
  /** The instance's own env (its spec's), under the request's. */
  env: Record<string, string>;
  /** How long an agent that is not (yet) connected is waited for: a guest still booting gets there. */
  agentWaitMs: number;
  /**
   * The error for a domain libvirt says is not running (paused, stopped, crashed), or null when it runs: asked
   * only then, so that an exec costs no state query of its own.
   */
  notRunning: () => Promise<RuntimeError | null>;
}

/** What a command sees besides its env: guest-exec's `env` replaces the whole environment. */
const BASE_ENV = { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", HOME: "/root", TERM: "xterm", LANG: "C.UTF-8" };
const READ_BYTES = 2 ** 20;
const STREAM_MS = 100;
/** libvirt refuses strings over 4 MiB in a call: the guest-exec request (argv, env, stdin) must fit well under it. */
const REQUEST_MAX = 3 * 2 ** 20;
// A missing command is the shell's 127 whichever setsid runs it (util-linux's would exit 1).
const WRAPPER = [
  'o=$1 e=$2; shift 2; exec >>"$o" 2>>"$e" || exit 125; rm -f "$o" "$e"',
  'command -v "$1" >/dev/null 2>&1 || { echo "$1: command not found" >&2; exit 127; }',
  'if command -v setsid >/dev/null 2>&1; then exec setsid "$@"; fi; exec "$@"',
].join("\n");
const SIGNALS: Record<number, string> = {
  1: "SIGHUP",
  2: "SIGINT",
  3: "SIGQUIT",
  6: "SIGABRT",
  9: "SIGKILL",
  11: "SIGSEGV",
  13: "SIGPIPE",
  14: "SIGALRM",
  15: "SIGTERM",
};

interface Status {
  exited: boolean;
  exitcode?: number;
  signal?: number;
}

export async function guestExec(
  id: string,
  agent: AgentCall,
  req: Omit<ExecRequest, "instanceId">,
  o: GuestExecOptions,
  onOutput: (stream: "stdout" | "stderr", data: string) => void,
): Promise<ExecResult> {
  const env = { ...BASE_ENV, ...o.env, ...req.env };
  for (const k of Object.keys(env))
    if (!/^[^=\0]+$/.test(k)) throw new RuntimeError(`exec: environment name ${JSON.stringify(k)} is not valid`, false, "invalid");
  const tag = randomBytes(8).toString("hex");
  const paths = { stdout: `/tmp/.bc-exec-${tag}.out`, stderr: `/tmp/.bc-exec-${tag}.err` };
  const execArgs: Record<string, unknown> = {
    path: "/bin/sh",
    arg: ["-c", WRAPPER, "bc-exec", paths.stdout, paths.stderr, ...req.command],
    env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
    "capture-output": false,
  };
  if (req.stdin !== null) execArgs["input-data"] = Buffer.from(req.stdin, "utf8").toString("base64");
  if (JSON.stringify(execArgs).length > REQUEST_MAX) throw new RuntimeError("exec: command, env and stdin together are over 3 MiB", false, "invalid");

  const out = await openWhenReady(id, agent, paths.stdout, o);
  const handles = { stdout: out, stderr: out };
  try {
    handles.stderr = (await agent({ execute: "guest-file-open", arguments: { path: paths.stderr, mode: "w+" } })) as number;
    const { pid } = (await agent({ execute: "guest-exec", arguments: execArgs })) as { pid: number };
    const decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    const drainOne = async (stream: "stdout" | "stderr") => {
      for (;;) {
        const r = (await agent({ execute: "guest-file-read", arguments: { handle: handles[stream], count: READ_BYTES } })) as {
          count: number;
          "buf-b64"?: string;
        };
        if (r.count > 0) {
          const text = decoders[stream].decode(Buffer.from(r["buf-b64"] ?? "", "base64"), { stream: true });
          if (text) onOutput(stream, text);
        }
        if (r.count < READ_BYTES) return;
      }
    };
    let drained = Date.now();
    const drain = async () => {
      drained = Date.now();
      await Promise.all([drainOne("stdout"), drainOne("stderr")]);
    };
    const deadline = Date.now() + req.timeoutMs;
    let timedOut = false;
    let killedAt = 0;
    let status: Status = { exited: false };
    let unreachableSince = 0;
    // Not at once: under emulation the guest's one vCPU runs the command and the agent both, and each poll
    // takes it from the command. Then quicker than a tenth of a second for short commands, no slower after.
    let pause = 10;
    for (;;) {
      try {
        // qemu-ga forgets a pid once it has said it exited: that answer is kept.
        if (!status.exited) status = (await agent({ execute: "guest-exec-status", arguments: { pid } })) as Status;
        // Read after the status: all that an exited command wrote is in the files by then. While it runs, what
        // it wrote is passed on every STREAM_MS; a short command costs no reads but the last.
        if (status.exited || Date.now() - drained >= STREAM_MS) await drain();
        unreachableSince = 0;
      } catch (e) {
        // A snapshot saves the domain (it is off for a few seconds), a pause stops it: the command goes on after.
        if (!unreachable(e)) throw e;
        unreachableSince ||= Date.now();
        if (Date.now() - unreachableSince > UNREACHABLE_MS)
          throw new RuntimeError(`${id}: its guest agent was gone for ${UNREACHABLE_MS / 1000} s during exec (${(e as Error).message})`, true, "unsupported");
        await sleep(200);
        continue;
      }
      if (status.exited) break;
      if (!timedOut && Date.now() >= deadline) {
        timedOut = true;
        killedAt = Date.now();
        await kill(agent, pid);
      }
      // A process that SIGKILL does not end (stuck in the kernel) is given up on rather than waited for forever.
      if (timedOut && Date.now() - killedAt > 10_000) return { exitCode: null, signal: null, timedOut };
      await sleep(Math.min(pause, Math.max(1, deadline - Date.now())));
      pause = Math.min(pause * 2, STREAM_MS);
    }
    for (const stream of ["stdout", "stderr"] as const) {
      const rest = decoders[stream].decode();
      if (rest) onOutput(stream, rest);
    }
    const signal = status.signal ?? null;
    return { exitCode: signal === null ? (status.exitcode ?? null) : null, signal: signal === null ? null : (SIGNALS[signal] ?? `SIG${signal}`), timedOut };
  } finally {
    // Not waited for: the result is known, and the files are unlinked in the guest already.
    for (const h of new Set([handles.stdout, handles.stderr])) void agent({ execute: "guest-file-close", arguments: { handle: h } }).catch(() => {});
  }
}

const UNREACHABLE_MS = 30_000;
/** virErrorNumber VIR_ERR_NO_DOMAIN: the domain was removed. */
const VIR_ERR_NO_DOMAIN = 42;
const unreachable = (e: unknown) => e instanceof LibvirtCallError && /not running|not connected|not available|not responding/i.test(e.message);

/**
 * The first file is opened as soon as the agent answers: a guest still booting has no agent yet (libvirt says
 * "not connected"), and one whose agent never comes, or whose domain has no agent channel at all, is refused
 * with a message that says so.
 */
async function openWhenReady(id: string, agent: AgentCall, path: string, o: GuestExecOptions): Promise<number> {
  const waitMs = o.agentWaitMs;
  const end = Date.now() + waitMs;
  let pause = 20;
  for (;;) {
    try {
      return (await agent({ execute: "guest-file-open", arguments: { path, mode: "w+" } })) as number;
    } catch (e) {
      const message = e instanceof Error ? e.message : String(e);
      if (e instanceof LibvirtCallError && e.code === VIR_ERR_NO_DOMAIN) throw new RuntimeError(`no domain ${id} on this host`, true, "not-found");
      if (/not configured/i.test(message)) throw new RuntimeError(`${id} has no QEMU guest agent: its domain has no agent channel`, false, "unsupported");
      if (!/not connected|not available|not responding|not running/i.test(message) || !(e instanceof LibvirtCallError)) throw asRuntimeError(e);
      if (/not running/i.test(message) || Date.now() >= end) {
        const why = await o.notRunning();
        if (why) throw why;
      }
      if (Date.now() >= end)
        throw new RuntimeError(
          `${id} has no QEMU guest agent connected after ${Math.round(waitMs / 1000)} s (${message}): the guest must run qemu-guest-agent on the virtio port org.qemu.guest_agent.0`,
          false,
          "unsupported",
        );
      await sleep(pause);
      pause = Math.min(pause * 2, 500);
    }
  }
}

/** The command's process group (its session: see WRAPPER), or the process alone where setsid was missing. */
async function kill(agent: AgentCall, pid: number): Promise<void> {
  await agent({
    execute: "guest-exec",
    arguments: { path: "/bin/sh", arg: ["-c", 'kill -9 -- "-$1" 2>/dev/null || kill -9 "$1"', "bc-kill", String(pid)] },
  }).catch(() => {});
}

/** What the guest agent's channel refused, as the host reports it: this guest cannot run commands (`unsupported`). */
export function asRuntimeError(e: unknown): RuntimeError {
  if (e instanceof RuntimeError) return e;
  return new RuntimeError(`guest agent: ${e instanceof Error ? e.message : String(e)}`, !(e instanceof LibvirtCallError), "unsupported");
}
