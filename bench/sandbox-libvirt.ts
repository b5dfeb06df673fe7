/**
 * `npm run bench:sandbox -- --libvirt 1 [--rounds 8]`: sandbox starts through the whole platform on this
 * machine's libvirtd (server, worker and one agent as processes, PostgreSQL and Redis; the test guest with the
 * QEMU guest agent from tests/kvm), against the same hypervisor operations done bare through the bindings:
 *   - warm claim (API call → the RUNNING sandbox event over the websocket) vs a bare resume of a paused domain;
 *   - restore from a snapshot (→ RUNNING event) vs a bare restore of a saved domain of the same size.
 * The bare operations run on the last restored copy, with the agent stopped and the source sandbox still
 * running, as it did during the timed restores (without KVM a running guest keeps most of a CPU busy); as many
 * of each as timed rounds, so both medians rest on as many samples.
 * Goals: warm claim p50 ≤ 50 ms, p99 ≤ 120 ms; restore ≤ 1.2× the bare restore.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openLibvirt } from "../agent/runtimes/libvirt-kvm/binding.ts";
import * as bc from "../sdk/client.ts";
import { type Cluster, startCluster } from "../tests/e2e/processes.ts";
import { buildAgentGuest, fileSha256, loopbackSourceFlags, makeBridge, openPath, requireHypervisor, serveFiles } from "../tests/kvm/support.ts";
import { percentile } from "./lib.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const stats = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return { p50: percentile(s, 50), p99: percentile(s, 99), n: s.length };
};
const fmt = (x: ReturnType<typeof stats>) => `p50 ${x.p50.toFixed(1)} ms, p99 ${x.p99.toFixed(1)} ms (${x.n})`;

export async function libvirtBench(rounds: number): Promise<void> {
  await requireHypervisor();
  const guest = await buildAgentGuest();
  for (const p of [guest.kernel, guest.initrd]) await openPath(p);
  const bridge = await makeBridge(`bcbs${process.pid % 10000}`);
  const scratch = mkdtempSync(join(tmpdir(), "bc-sbx-bare-"));
  await openPath(scratch);
  let c: Cluster | undefined;
  const files = await serveFiles({ "base.qcow2": guest.base });
  const hv = await openLibvirt();
  try {
    c = await startCluster({
      hosts: 1,
      runtime: "libvirt-kvm",
      agentArgs: ["--kernel", guest.kernel, "--initrd", guest.initrd, "--cmdline", guest.cmdline, "--shutdown-timeout-ms", "1500", ...loopbackSourceFlags],
      env: {
        VPS_HOST_NETWORK: bridge.name,
        VPS_RUNTIMES: "libvirt-kvm",
        NODE_LOST_GRACE_MS: "15000",
        IMAGE_SOURCE_HTTP: "true",
        SANDBOX_SWEEP_MS: "250",
        LIMIT_RATE_POINTS: "0",
      },
    });
    const cl = c;
    const { createTenant } = await cl.operator.request(bc.CreateTenantDocument, { input: { name: "bench" } });
    await cl.operator.request(bc.SetTenantQuotaDocument, { tenantId: createTenant.id, quota: { sandboxWarm: 1 } });
    const { createApiToken } = await cl.operator.request(bc.CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "b" } });
    const t = cl.client(createApiToken.token);
    const { registerImage } = await t.request(bc.RegisterImageDocument, {
      input: { name: "agent-guest", source: files.url("base.qcow2"), sha256: fileSha256(guest.base), format: "QCOW2" },
    });
    const { createSandboxTemplate: tpl } = await t.request(bc.CreateSandboxTemplateDocument, {
      input: { name: "bench", poolId: cl.poolId, flavor: "tiny", imageId: registerImage.id, ttlSeconds: 3600, warm: 1 },
    });
    const ws = await bc.createWsClient({ url: cl.url, token: createApiToken.token });
    const running = new Map<string, number>();
    void (async () => {
      for await (const e of ws.subscribe(bc.SandboxEventsDocument, {}))
        if (e.sandboxEvents.state === "RUNNING") running.set(e.sandboxEvents.sandboxId, performance.now());
    })().catch(() => {});
    const timed = async (input: bc.CreateSandboxInput) => {
      const t0 = performance.now();
      const { createSandbox } = await t.request(bc.CreateSandboxDocument, { input });
      for (const end = Date.now() + 300_000; !running.has(createSandbox.id); await sleep(1))
        if (Date.now() > end) throw new Error(`sandbox ${createSandbox.id} not running after 5 minutes`);
      return { ms: (running.get(createSandbox.id) as number) - t0, sandbox: createSandbox };
    };
    const gone = async (instanceId: string) => {
      while ((await cl.inspect((p) => p.db.prisma.instance.findUnique({ where: { id: instanceId }, select: { state: true } })))?.state !== "deleted")
        await sleep(50);
    };
    const ready = async () => (await t.request(bc.SandboxTemplateDocument, { id: tpl.id })).sandboxTemplate?.warm.ready ?? 0;

    const warm: number[] = [];
    for (let r = 0; r < rounds; r++) {
      while ((await ready()) < 1) await sleep(50);
      const w = await timed({ templateId: tpl.id });
      if (w.sandbox.warm) warm.push(w.ms);
      await t.request(bc.DeleteSandboxDocument, { id: w.sandbox.id });
      await gone(w.sandbox.instance.id);
    }

    // Restores: the warm pool steps aside (two vCPUs here), a source sandbox is snapshotted, copies are timed.
    await t.request(bc.UpdateSandboxTemplateDocument, { id: tpl.id, input: { warm: 0 } });
    while ((await cl.inspect((p) => p.db.prisma.instance.count({ where: { warmTemplateId: tpl.id, claimedAt: null, state: { not: "deleted" } } }))) > 0)
      await sleep(100);
    const src = (await timed({ templateId: tpl.id })).sandbox;
    const { createSandboxSnapshot: snap } = await t.request(bc.CreateSandboxSnapshotDocument, { sandboxId: src.id });
    while ((await t.request(bc.SandboxSnapshotDocument, { id: snap.id })).sandboxSnapshot?.state !== "READY") await sleep(100);
    const restore: number[] = [];
    let copy: bc.CreateSandboxMutation["createSandbox"] | undefined;
    for (let r = 0; r < rounds; r++) {
      if (copy) {
        await t.request(bc.DeleteSandboxDocument, { id: copy.id });
        await gone(copy.instance.id);
      }
      const c = await timed({ snapshotId: snap.id });
      restore.push(c.ms);
      copy = c.sandbox;
    }
    // The bare limits, on the last copy's domain with the agent stopped (its converger would otherwise resume a
    // guest the bench pauses), while the source sandbox runs on as it did during the restores: a resume of the
    // paused guest, and a restore of the saved guest.
    await cl.agents[0]?.stop();
    const bare = (copy as NonNullable<typeof copy>).instance.id;
    const bareResume: number[] = [];
    for (let r = 0; r < rounds; r++) {
      const dom = await hv.domainLookupByName(bare);
      await hv.domainSuspend(dom);
      const t0 = performance.now();
      await hv.domainResume(dom);
      bareResume.push(performance.now() - t0);
    }
    const bareRestore: number[] = [];
    const file = join(scratch, "bare.save");
    for (let r = 0; r < rounds; r++) {
      await hv.domainSave(await hv.domainLookupByName(bare), file);
      const t0 = performance.now();
      await hv.domainRestore(file);
      bareRestore.push(performance.now() - t0);
    }
    await ws.dispose();

    const w = stats(warm);
    const br = stats(bareResume);
    const rs = stats(restore);
    const bs = stats(bareRestore);
    console.log(`sandbox bench on libvirt (this machine: ${(await hv.nodeGetInfo()).cpus} CPUs); the agent guest, flavor tiny; ${rounds} rounds`);
    console.log(`warm claim → RUNNING event: ${fmt(w)}   (goal p50 <= 50 ms, p99 <= 120 ms)`);
    console.log(`  bare resume:              ${fmt(br)}`);
    console.log(`restore    → RUNNING event: ${fmt(rs)}`);
    console.log(`  bare restore:             ${fmt(bs)}`);
    console.log(`restore ratio to bare:      ${(rs.p50 / bs.p50).toFixed(2)}x at p50 (goal <= 1.2x)`);
  } finally {
    // Whatever the run left (the source sandbox, a refill a failed run started): this cluster's domains go
    // with it, so no guest outlives the bench. Agents stop first, so none makes a domain after the look.
    for (const a of c?.agents ?? []) await a.stop().catch(() => a.child.kill("SIGKILL"));
    const ours = c ? await c.inspect((p) => p.db.prisma.instance.findMany({ select: { id: true } })).catch(() => []) : [];
    for (const { id } of ours) {
      const dom = await hv.domainLookupByName(id).catch(() => null);
      if (dom) {
        await hv.domainDestroy(dom).catch(() => {});
        await hv.domainUndefine(dom).catch(() => {});
      }
    }
    await hv.connectClose().catch(() => {});
    await c?.close();
    await bridge.remove();
    await files.close();
    rmSync(scratch, { recursive: true, force: true });
  }
}
