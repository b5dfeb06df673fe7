import { type ChildProcess, fork } from "node:child_process";
import { EventEmitter } from "node:events";
import { fileURLToPath } from "node:url";

/**
 * A fake host's guest commands, started by a spawner process of its own (./spawner.mjs, which says why): one per
 * GuestProcesses, forked when the first exec comes and again if it dies. What it relays arrives here as events
 * of one `Spawned` per command.
 */

/** One command the spawner started: its events, in the order the spawner saw them. */
export interface Spawned {
  /** Its pid, once started: the group it leads is signalled from here. */
  pid: number | undefined;
  on(event: "spawn", listener: (pid: number) => void): this;
  on(event: "error", listener: (code: string | null, message: string) => void): this;
  /** fd 1 stdout, 2 stderr, 3 the confinement wrapper's word (./confine.ts); text, decoded. */
  on(event: "data", listener: (fd: 1 | 2 | 3, data: string) => void): this;
  on(event: "end", listener: (fd: 1 | 2 | 3) => void): this;
  on(event: "exit", listener: (code: number | null, signal: NodeJS.Signals | null) => void): this;
  on(event: "close", listener: () => void): this;
  /** Stop reading its output (its process exited, but something kept the pipes open). */
  destroyOutput(): void;
}

type Message =
  | { t: "spawn"; id: number; pid: number }
  | { t: "error"; id: number; code: string | null; message: string }
  | { t: "data"; id: number; fd: 1 | 2 | 3; data: string }
  | { t: "end"; id: number; fd: 1 | 2 | 3 }
  | { t: "exit"; id: number; code: number | null; signal: NodeJS.Signals | null }
  | { t: "close"; id: number };

const SPAWNER = fileURLToPath(new URL("./spawner.mjs", import.meta.url));

export class Spawner {
  private helper: ChildProcess | null = null;
  private next = 0;
  private readonly running = new Map<number, Spawned & EventEmitter>();

  /** Start `file` with `args` (no environment of ours, cwd /, its own session); `stdin` is written and closed. */
  spawn(file: string, args: string[], stdin: string | null): Spawned {
    const id = this.next++;
    const proc = Object.assign(new EventEmitter(), {
      pid: undefined as number | undefined,
      destroyOutput: () => this.helper?.send({ t: "destroy", id }),
    }) as Spawned & EventEmitter;
    this.running.set(id, proc);
    const helper = this.spawner();
    // Queued by the IPC channel until the spawner is up; a failed send is the spawner's death, handled there.
    helper.send({ t: "spawn", id, file, args, stdin }, (err) => {
      if (err) this.gone(id, `the fake host's spawner is gone: ${err.message}`);
    });
    return proc;
  }

  /** Stop the spawner: its guests' commands end with it (bubblewrap's --die-with-parent). */
  close(): void {
    this.helper?.kill("SIGKILL");
    this.helper = null;
  }

  private spawner(): ChildProcess {
    if (this.helper?.connected) return this.helper;
    // No loader flags of ours (it is plain JavaScript), nothing of our environment, its output on ours.
    const helper = fork(SPAWNER, [], { execArgv: [], env: {}, stdio: ["ignore", "inherit", "inherit", "ipc"], serialization: "json" });
    helper.on("message", (m: Message) => this.deliver(m));
    helper.once("exit", () => {
      if (this.helper === helper) this.helper = null;
      for (const id of [...this.running.keys()]) this.gone(id, "the fake host's spawner exited");
    });
    // Not what keeps the agent's process alive: it ends when its parent does.
    helper.unref();
    helper.channel?.unref();
    this.helper = helper;
    return helper;
  }

  private deliver(m: Message): void {
    const proc = this.running.get(m.id);
    if (!proc) return;
    switch (m.t) {
      case "spawn":
        proc.pid = m.pid;
        proc.emit("spawn", m.pid);
        return;
      case "error":
        this.running.delete(m.id);
        proc.emit("error", m.code, m.message);
        return;
      case "data":
        proc.emit("data", m.fd, m.data);
        return;
      case "end":
        proc.emit("end", m.fd);
        return;
      case "exit":
        proc.emit("exit", m.code, m.signal);
        return;
      case "close":
        this.running.delete(m.id);
        proc.emit("close");
    }
  }

  /** A command whose spawner died: it ends as a spawn that failed (retryable: the next exec forks a new one). */
  private gone(id: number, why: string): void {
    const proc = this.running.get(id);
    if (!proc) return;
    this.running.delete(id);
    if (proc.pid === undefined) proc.emit("error", "ESPAWNER", why);
    else {
      proc.emit("exit", null, "SIGKILL");
      proc.emit("close");
    }
  }
}
