/**
 * Sandbox start times through the whole platform, on simulated hosts (the fake runtime).
 *
 *   npm run bench:sandbox -- [--rounds 30] [--warm 4] [--hosts 2] [--pg 0]
 *   npm run bench:sandbox -- --libvirt 1 [--rounds 8]     (real libvirt: ./sandbox-libvirt.ts)
 *
 * One process runs the server, the worker and `hosts` agents on the fake runtime (embedded database and
 * in-memory jobs, or PostgreSQL and Redis with --pg 1). Each round measures, from the API call to the
 * `sandboxEvents` message saying RUNNING received over the websocket:
 *   - a warm claim (a template whose pool is `warm`, waited full between rounds);
 *   - a cold start (a template without a warm pool);
 *   - a restore (a new sandbox from a READY snapshot on the same host).
 * The fake runtime's own operations take microseconds, so these are the platform's overhead: API, admission,
 * spec push, agent, report, reconciler, event feed. The same operations done bare on libvirt are measured by
 * the --libvirt 1 mode. Prints p50/p99 of each.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startAgent } from "../agent/index.ts";
import { createFakeRuntime } from "../agent/runtimes/fake/index.ts";
import * as bc from "../sdk/client.ts";
import { benchApi, benchArgs, exitWhenDone, percentile } from "./lib.ts";

const args = benchArgs({ rounds: 30, warm: 4, hosts: 2, pg: 0, libvirt: 0 });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const fmt = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return `p50 ${percentile(s, 50).toFixed(1)} ms, p99 ${percentile(s, 99).toFixed(1)} ms (${s.length})`;
};

async function run() {
  const dir = mkdtempSync(join(tmpdir(), "bc-sbx-bench-"));
  const api = await benchApi({
    poolSize: 12,
    embedded: !args.pg,
    env: { RECONCILE_SWEEP_MS: "1000", SANDBOX_SWEEP_MS: "500", SANDBOX_WARM_QUOTA: String(args.warm * 2), LIMIT_RATE_POINTS: "0" },
    ipv4Range: "10.101.0.0/20",
    tiny: { vcpus: 1, memoryMib: 256, diskGib: 2 },
    image: { source: "https://images.invalid/i.qcow2", sha256: "b".repeat(64) },
  });
  const agents = [];
  try {
    for (let i = 0; i < args.hosts; i++) {
      const stateDir = join(dir, `host-${i}`);
      const runtime = createFakeRuntime({ dir: join(stateDir, "fake"), capacity: { vcpus: 512, memoryMib: 1_048_576, diskGib: 10_000, gpus: [] } });
      agents.push(await startAgent({ server: api.url, joinToken: await api.joinToken(), name: `h${i}`, stateDir, heartbeatMs: 2000, runtime }));
    }
    await api.hostsReported(args.hosts);
    const t = api.tenant;
    const tpl = async (name: string, warm: number) =>
      (await t.request(bc.CreateSandboxTemplateDocument, { input: { name, poolId: api.poolId, flavor: "tiny", imageId: api.imageId, ttlSeconds: 600, warm } }))
        .createSandboxTemplate;
    const warmTpl = await tpl("warm", args.warm);
    const coldTpl = await tpl("cold", 0);
    const ready = async () => (await t.request(bc.SandboxTemplateDocument, { id: warmTpl.id })).sandboxTemplate?.warm.ready ?? 0;

    const ws = await bc.createWsClient({ url: api.url, token: api.tenantToken });
    /** API call → the RUNNING event for that sandbox, received over the websocket. */
    const timed = async (input: bc.CreateSandboxInput) => {
      const after = (await t.request(bc.InstanceEventsCursorDocument)).instanceEventsCursor;
      const seen = new Map<string, number>();
      const events = ws.subscribe(bc.SandboxEventsDocument, { after });
      const listening = (async () => {
        for await (const e of events) if (e.sandboxEvents.state === "RUNNING") seen.set(e.sandboxEvents.sandboxId, performance.now());
      })();
      const t0 = performance.now();
      const { createSandbox } = await t.request(bc.CreateSandboxDocument, { input });
      while (!seen.has(createSandbox.id)) await sleep(1);
      const ms = (seen.get(createSandbox.id) as number) - t0;
      await events.return?.();
      await listening.catch(() => {});
      return { ms, sandbox: createSandbox };
    };

    const warm: number[] = [];
    const cold: number[] = [];
    const restore: number[] = [];
    let misses = 0;
    const source = (await timed({ templateId: coldTpl.id })).sandbox;
    const { createSandboxSnapshot: snap } = await t.request(bc.CreateSandboxSnapshotDocument, { sandboxId: source.id });
    while ((await t.request(bc.SandboxSnapshotDocument, { id: snap.id })).sandboxSnapshot?.state !== "READY") await sleep(20);
    for (let r = 0; r < args.rounds; r++) {
      while ((await ready()) < args.warm) await sleep(20);
      const w = await timed({ templateId: warmTpl.id });
      if (w.sandbox.warm) warm.push(w.ms);
      else misses++;
      const c = await timed({ templateId: coldTpl.id });
      cold.push(c.ms);
      const s = await timed({ snapshotId: snap.id });
      restore.push(s.ms);
      for (const x of [w.sandbox, c.sandbox, s.sandbox]) await t.request(bc.DeleteSandboxDocument, { id: x.id });
    }
    await ws.dispose();
    console.log(`sandbox bench: ${args.pg ? "PostgreSQL + Redis" : "embedded"}; ${args.hosts} fake hosts; warm pool ${args.warm}; ${args.rounds} rounds`);
    console.log(`warm claim → RUNNING event: ${fmt(warm)}${misses ? `; ${misses} claims found the pool empty` : ""}`);
    console.log(`cold start → RUNNING event: ${fmt(cold)}`);
    console.log(`restore    → RUNNING event: ${fmt(restore)}`);
  } finally {
    for (const a of agents) await a.close();
    await api.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

exitWhenDone(args.libvirt ? import("./sandbox-libvirt.ts").then((m) => m.libvirtBench(args.rounds)) : run());
