import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "vitest";
import { startAgent } from "../../agent/index.ts";
import { createFakeRuntime } from "../../agent/runtimes/fake/index.ts";
import { canTransition, type InstanceState } from "../../core/instances/state.ts";
import type { Client } from "../../sdk/client.ts";
import { CreateFlavorDocument, CreateJoinTokenDocument, CreatePoolDocument, InstanceDocument, RegisterImageDocument } from "../../sdk/client.ts";
import { startWorker } from "../../worker/index.ts";
import { sha256Of, until } from "./fixtures.ts";
import { type Harness, startHarness } from "./harness.ts";
import { invariantViolations, ledger } from "./ledger.ts";

/** Timing for host tests: short graces so lost hosts and orphans are seen in seconds, not minutes. */
export const hostEnv = { NODE_LOST_GRACE_MS: "1500", ORPHAN_GRACE_MS: "500", RECONCILE_SWEEP_MS: "300", MAX_RECREATE_ATTEMPTS: "3" };

export interface Hosts {
  h: Harness;
  poolId: string;
  imageId: string;
  dirs: string[];
  agents: (Awaited<ReturnType<typeof startAgent>> | null)[];
  /** Start (or restart, keeping its state dir and so its node) host i. */
  start(i: number): Promise<void>;
  stop(i: number): Promise<void>;
  close(): Promise<void>;
}

/** A platform with a worker and `count` simulated hosts (fake runtime, in this process) in one hosted pool. */
export async function startHosts(count: number, env: Record<string, string> = {}, opts: { now?: () => Date; worker?: boolean } = {}): Promise<Hosts> {
  const h = await startHarness({ ...hostEnv, ...env }, opts);
  // Without a worker, only what the server itself does moves instances (the passes it takes on host reports).
  const worker = opts.worker === false ? null : await startWorker(h.platform);
  const { createPool } = await h.operator.request(CreatePoolDocument, { input: { name: "sim", class: "VPS_HOST", ipv4Range: "10.60.0.0/22" } });
  for (const f of [
    { name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 },
    { name: "medium", vcpus: 2, memoryMib: 2048, diskGib: 20 },
  ])
    await h.operator.request(CreateFlavorDocument, { input: { poolId: createPool.id, ...f } });
  const { registerImage } = await h.operator.request(RegisterImageDocument, {
    input: { name: "debian", source: "https://images.invalid/debian.qcow2", sha256: sha256Of("c"), format: "QCOW2", public: true },
  });
  const root = mkdtempSync(join(tmpdir(), "bc-hosts-"));
  const dirs = Array.from({ length: count }, (_, i) => join(root, `host-${i + 1}`));
  const agents: Hosts["agents"] = dirs.map(() => null);
  const hosts: Hosts = {
    h,
    poolId: createPool.id,
    imageId: registerImage.id,
    dirs,
    agents,
    async start(i) {
      const { createJoinToken } = await h.operator.request(CreateJoinTokenDocument, { poolId: createPool.id });
      agents[i] = await startAgent({
        server: h.url,
        joinToken: createJoinToken.token,
        name: `host-${i + 1}`,
        stateDir: dirs[i] as string,
        runtime: createFakeRuntime({ dir: join(dirs[i] as string, "fake-host"), capacity: { vcpus: 8, memoryMib: 16384, diskGib: 200, gpus: [] } }),
        heartbeatMs: 300,
      });
    },
    async stop(i) {
      await agents[i]?.close();
      agents[i] = null;
    },
    async close() {
      for (let i = 0; i < agents.length; i++) await hosts.stop(i);
      await worker?.close();
      await h.close();
      rmSync(root, { recursive: true, force: true });
    },
  };
  for (let i = 0; i < count; i++) await hosts.start(i);
  // Every host has reported its capacity before a test places anything.
  await until("every host to report", async () => (await h.platform.db.prisma.node.count({ where: { poolId: createPool.id, capVcpus: { gt: 0 } } })) === count);
  return hosts;
}

/** Wait (bounded) until the instance is in `state`; returns it. */
export async function waitForState(client: Client, id: string, state: string, timeout = 20_000) {
  await expect.poll(async () => (await client.request(InstanceDocument, { id })).instance?.state, { timeout, interval: 50 }).toBe(state);
  return (await client.request(InstanceDocument, { id })).instance;
}

/** Every recorded change moved along the state table, and versions are 1..n with one event each. */
export async function eventViolations(h: { platform: Pick<Harness["platform"], "db"> }): Promise<string[]> {
  const events = await h.platform.db.prisma.instanceEvent.findMany({ orderBy: [{ instanceId: "asc" }, { version: "asc" }] });
  const out: string[] = [];
  let prev: (typeof events)[number] | undefined;
  for (const e of events) {
    if (prev?.instanceId !== e.instanceId) {
      if (e.version !== 1) out.push(`${e.instanceId} starts at version ${e.version}`);
    } else {
      if (e.version !== prev.version + 1) out.push(`${e.instanceId}: version ${prev.version} then ${e.version}`);
      if (e.fromState !== prev.toState) out.push(`${e.instanceId} v${e.version}: from ${e.fromState} but was ${prev.toState}`);
      if (e.fromState !== e.toState && !canTransition(e.fromState as InstanceState, e.toState as InstanceState))
        out.push(`${e.instanceId} v${e.version}: illegal ${e.fromState} → ${e.toState}`);
    }
    prev = e;
  }
  return out;
}

/**
 * The books once everything is deleted: the invariants hold, every event moved along the state table once per
 * version, and nothing is held — no allocation, address lease, GPU or quota charge.
 */
export async function expectNothingHeld(platform: Pick<Harness["platform"], "db">): Promise<void> {
  expect(await invariantViolations(platform)).toEqual([]);
  expect(await eventViolations({ platform })).toEqual([]);
  const l = await ledger(platform);
  expect(l.counts).toMatchObject({ allocations: 0, leases: 0, gpus_held: 0 });
  expect(l.usage).toEqual([]);
}
