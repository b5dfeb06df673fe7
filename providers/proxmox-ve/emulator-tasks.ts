import { PveFail } from "./emulator-params.ts";

/**
 * The emulator's worker tasks. PVE forks a worker per long action and names it by a UPID; a client polls the
 * task's status until it is `stopped`, with `exitstatus` OK or the error text.
 */

interface Task {
  upid: string;
  type: string;
  id: string;
  user: string;
  pid: number;
  pstart: number;
  starttime: number;
  status: "running" | "stopped";
  exitstatus?: string;
  log: string[];
}

export const hex8 = (n: number) => n.toString(16).toUpperCase().padStart(8, "0");
const upidPattern = /^UPID:[^:]+:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:[^:]*:[^:]*:[^:]+:$/;

export class Tasks {
  private readonly tasks = new Map<string, Task>();
  private readonly timers = new Set<NodeJS.Timeout>();
  private pid = 0x2a00;

  constructor(
    private readonly node: string,
    private readonly actionMs: number,
  ) {}

  /** A task as PVE starts one: the UPID names node, pid, process start, start time, type, VM and user, with a trailing colon. */
  start(type: string, id: number | string, user: string): Task {
    const pid = this.pid++;
    const pstart = 0x100000 + pid * 17;
    const starttime = Math.floor(Date.now() / 1000);
    const upid = `UPID:${this.node}:${hex8(pid)}:${hex8(pstart)}:${hex8(starttime)}:${type}:${id}:${user}:`;
    const task: Task = { upid, type, id: String(id), user, pid, pstart, starttime, status: "running", log: [] };
    this.tasks.set(upid, task);
    return task;
  }

  finish(task: Task, error?: string) {
    task.status = "stopped";
    task.exitstatus = error ?? "OK";
    task.log.push(error ? `TASK ERROR: ${error}` : "TASK OK");
  }

  /** A task that does `work` after actionMs; `work` returns an error text to fail it. */
  run(type: string, id: number, user: string, work: () => string | undefined): string {
    const task = this.start(type, id, user);
    this.later(this.actionMs, () => this.finish(task, work()));
    return task.upid;
  }

  later(ms: number, fn: () => void) {
    const t = setTimeout(() => {
      this.timers.delete(t);
      fn();
    }, ms);
    this.timers.add(t);
  }

  status(upid: string) {
    const t = this.find(upid);
    const { log: _log, exitstatus, ...rest } = t;
    return { ...rest, node: this.node, ...(exitstatus ? { exitstatus } : {}) };
  }

  log(upid: string, start: number, limit: number) {
    return this.find(upid)
      .log.map((t, i) => ({ n: i + 1, t }))
      .slice(start, start + limit);
  }

  close() {
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
  }

  private find(upid: string): Task {
    if (!upidPattern.test(upid)) throw new PveFail(400, "unable to parse worker upid");
    const task = this.tasks.get(upid);
    if (!task) throw new PveFail(500, `no such task '${upid}'`);
    return task;
  }
}
