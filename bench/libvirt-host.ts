/**
 * bench/libvirt's host: the libvirt-kvm runtime and the agent. By default it runs in the bench's own process,
 * beside the server; with `--host-process 1` the bench forks this file and the host runs apart from the
 * control plane, as a host does beside its hypervisor, answering the bench's messages over the IPC channel.
 * Times cross between processes on the epoch clock (performance.timeOrigin + now).
 */
import { fork } from "node:child_process";
import { subscribe } from "node:diagnostics_channel";
import { fileURLToPath } from "node:url";
import { startAgent } from "../agent/index.ts";
import { createLibvirtRuntime } from "../agent/runtimes/libvirt-kvm/index.ts";
import { TRACE_CHANNEL, type TracePoint } from "../contracts/trace.ts";
import type { Guest } from "../tests/kvm/guest.ts";
import { loopbackSources } from "../tests/kvm/support.ts";

export interface HostStart {
  server: string;
  joinToken: string;
  stateDir: string;
  guest: Guest;
}

/** A runtime call of the host, on the epoch clock. */
export interface HostCall {
  kind: string;
  start: number;
  end: number;
}

export interface BenchHost {
  nodeId: string;
  /** Once the agent has nothing under way. */
  idle(): Promise<void>;
  consolePath(instanceId: string): Promise<string>;
  /** With BENCH_TRACE: the runtime's calls (and, in a process of its own, the agent's trace points) since the last take. */
  take(): Promise<{ calls: HostCall[]; points: TracePoint[] }>;
  close(): Promise<void>;
}

const ROLE = "BENCH_LIBVIRT_HOST";
const epoch = (t: number) => performance.timeOrigin + t;
/** An epoch time on this process's performance clock. */
export const local = (t: number) => t - performance.timeOrigin;

/** The host in this process. The agent's trace points go to this process's subscribers, not to `take`. */
export async function startHost(s: HostStart): Promise<BenchHost> {
  const calls: HostCall[] = [];
  const runtime = await createLibvirtRuntime({ stateDir: `${s.stateDir}/libvirt`, boot: s.guest, shutdownTimeoutMs: 1000, imageSources: loopbackSources });
  if (process.env.BENCH_TRACE)
    for (const kind of ["pause", "resume", "create", "start", "list", "capacity"] as const) {
      const real = (runtime[kind] as (...a: unknown[]) => Promise<unknown>).bind(runtime);
      (runtime as unknown as Record<string, unknown>)[kind] = async (...a: unknown[]) => {
        const begun = epoch(performance.now());
        try {
          return await real(...a);
        } finally {
          calls.push({ kind, start: begun, end: epoch(performance.now()) });
        }
      };
    }
  const agent = await startAgent({ server: s.server, joinToken: s.joinToken, name: "bench-host", stateDir: s.stateDir, runtime });
  return {
    nodeId: agent.nodeId,
    idle: () => agent.idle(),
    consolePath: async (id) => runtime.consolePath(id),
    take: async () => ({ calls: calls.splice(0), points: [] }),
    async close() {
      await agent.close();
      await runtime.close();
    },
  };
}

/** The host in a child process of its own. */
export async function forkHost(s: HostStart): Promise<BenchHost> {
  const child = fork(fileURLToPath(import.meta.url), [], { env: { ...process.env, [ROLE]: "1" }, stdio: "inherit" });
  const waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  let seq = 0;
  child.on("message", (m: { seq: number; value?: unknown; error?: string }) => {
    const w = waiting.get(m.seq);
    waiting.delete(m.seq);
    if (m.error !== undefined) w?.reject(new Error(`bench host: ${m.error}`));
    else w?.resolve(m.value);
  });
  child.on("exit", (code) => {
    for (const w of waiting.values()) w.reject(new Error(`bench host exited (${code})`));
    waiting.clear();
  });
  const ask = <T>(m: Record<string, unknown>) =>
    new Promise<T>((resolve, reject) => {
      const n = ++seq;
      waiting.set(n, { resolve: resolve as (v: unknown) => void, reject });
      child.send({ ...m, seq: n });
    });
  const { nodeId } = await ask<{ nodeId: string }>({ start: s });
  return {
    nodeId,
    idle: () => ask({ idle: true }),
    consolePath: (id) => ask({ console: id }),
    take: () => ask({ take: true }),
    async close() {
      await ask({ close: true });
      if (child.exitCode === null) await new Promise((r) => child.once("exit", r));
    },
  };
}

/** In the child: the host, driven by the bench's messages. */
async function serve() {
  const points: TracePoint[] = [];
  if (process.env.BENCH_TRACE) subscribe(TRACE_CHANNEL, (p) => points.push({ ...(p as TracePoint), at: epoch((p as TracePoint).at) }));
  let host: BenchHost | undefined;
  const answer = async (m: Record<string, unknown>): Promise<unknown> => {
    if (m.start) {
      host = await startHost(m.start as HostStart);
      return { nodeId: host.nodeId };
    }
    if (!host) throw new Error("the host has not started");
    if (m.idle) return host.idle();
    if (typeof m.console === "string") return host.consolePath(m.console);
    if (m.take) return { calls: (await host.take()).calls, points: points.splice(0) };
    if (m.close) return host.close();
    throw new Error(`no such request: ${JSON.stringify(m)}`);
  };
  process.on("message", (m: Record<string, unknown> & { seq: number }) => {
    answer(m).then(
      (value) => {
        process.send?.({ seq: m.seq, value: value ?? null });
        if (m.close) process.disconnect();
      },
      (e: unknown) => process.send?.({ seq: m.seq, error: String(e) }),
    );
  });
}

if (process.env[ROLE]) void serve();
