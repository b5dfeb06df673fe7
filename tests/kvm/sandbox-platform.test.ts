import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type Client,
  CreateApiTokenDocument,
  CreateSandboxDocument,
  CreateSandboxSnapshotDocument,
  CreateSandboxTemplateDocument,
  CreateTenantDocument,
  createWsClient,
  DeleteSandboxDocument,
  RegisterImageDocument,
  SandboxDocument,
  SandboxExecDocument,
  SandboxSnapshotDocument,
  SandboxTemplateDocument,
  SetTenantQuotaDocument,
  UpdateSandboxTemplateDocument,
} from "../../sdk/client.ts";
import { type Cluster, startCluster } from "../e2e/processes.ts";
import { until } from "../support/fixtures.ts";
import { invariantViolations } from "../support/ledger.ts";
import { type AgentGuest, buildAgentGuest, fileSha256, loopbackSourceFlags, makeBridge, openPath, requireHypervisor, serveFiles, virsh } from "./support.ts";

/**
 * Sandboxes through the whole platform on this machine's libvirtd: server, worker and an agent with the
 * libvirt-kvm runtime, a guest with the QEMU guest agent and a counter. A warm claim resumes a paused guest; exec
 * returns the guest's own output; a snapshot restored as a new sandbox carries the counter on from where it
 * stood.
 */
let c: Cluster;
let guest: AgentGuest;
let files: Awaited<ReturnType<typeof serveFiles>>;
let bridge: Awaited<ReturnType<typeof makeBridge>>;
let t: Client;
let token: string;
let templateId: string;

beforeAll(async () => {
  await requireHypervisor();
  guest = await buildAgentGuest();
  for (const p of [guest.kernel, guest.initrd]) await openPath(p);
  bridge = await makeBridge(`bcsp${process.pid % 10000}`);
  c = await startCluster({
    hosts: 1,
    runtime: "libvirt-kvm",
    agentArgs: ["--kernel", guest.kernel, "--initrd", guest.initrd, "--cmdline", guest.cmdline, "--shutdown-timeout-ms", "1500", ...loopbackSourceFlags],
    env: { VPS_HOST_NETWORK: bridge.name, VPS_RUNTIMES: "libvirt-kvm", NODE_LOST_GRACE_MS: "15000", IMAGE_SOURCE_HTTP: "true", SANDBOX_SWEEP_MS: "500" },
  });
  files = await serveFiles({ "base.qcow2": guest.base });
  const { createTenant } = await c.operator.request(CreateTenantDocument, { input: { name: "sbx" } });
  await c.operator.request(SetTenantQuotaDocument, { tenantId: createTenant.id, quota: { sandboxWarm: 2 } });
  const { createApiToken } = await c.operator.request(CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "t" } });
  token = createApiToken.token;
  t = c.client(token);
  const { registerImage } = await t.request(RegisterImageDocument, {
    input: { name: "agent-guest", source: files.url("base.qcow2"), sha256: fileSha256(guest.base), format: "QCOW2" },
  });
  const { createSandboxTemplate } = await t.request(CreateSandboxTemplateDocument, {
    input: { name: "kvm", poolId: c.poolId, flavor: "tiny", imageId: registerImage.id, ttlSeconds: 600, warm: 1, env: [{ name: "WHO", value: "sandbox" }] },
  });
  templateId = createSandboxTemplate.id;
}, 600_000);

afterAll(async () => {
  const errors = c?.errors() ?? [];
  if (errors.length) console.error(`process errors:\n${errors.slice(0, 20).join("\n")}`);
  await c?.close();
  await bridge?.remove();
  await files?.close();
});

async function exec(sandboxId: string, command: string[]): Promise<{ out: string; code: number | null }> {
  const ws = await createWsClient({ url: c.url, token, retryAttempts: 0 });
  try {
    let out = "";
    let code: number | null = null;
    for await (const m of ws.subscribe(SandboxExecDocument, { sandboxId, command, timeoutSeconds: 60 })) {
      if (m.sandboxExec.stream === "STDOUT") out += m.sandboxExec.data;
      if (m.sandboxExec.stream === "EXIT") code = m.sandboxExec.exitCode ?? null;
    }
    return { out, code };
  } finally {
    await ws.dispose();
  }
}

const counter = async (sandboxId: string) => Number((await exec(sandboxId, ["cat", "/tmp/bc-counter"])).out.trim());

describe("sandboxes on libvirt", () => {
  it("claims a paused warm guest, resumes it, and runs commands in it through the guest agent", async () => {
    await until(
      "a warm guest booted and paused",
      async () => (await t.request(SandboxTemplateDocument, { id: templateId })).sandboxTemplate?.warm.ready === 1,
      240_000,
      250,
    );
    const paused = (await virsh("list", "--all", "--state-paused", "--name")).split("\n").filter((n) => n.startsWith("inst_"));
    expect(paused.length).toBeGreaterThan(0);
    const t0 = performance.now();
    const { createSandbox: s } = await t.request(CreateSandboxDocument, { input: { templateId } });
    expect(s.warm).toBe(true);
    await until("the claimed sandbox running", async () => (await t.request(SandboxDocument, { id: s.id })).sandbox?.state === "RUNNING", 60_000, 10);
    console.log(`warm claim → RUNNING (polled): ${(performance.now() - t0).toFixed(0)} ms`);

    const uname = await exec(s.id, ["uname", "-r"]);
    expect(uname.code).toBe(0);
    expect(uname.out.trim()).toMatch(/^\d+\.\d+/);
    expect(uname.out.trim()).not.toBe((await import("node:os")).release());
    const env = await exec(s.id, ["sh", "-c", 'echo "$WHO"']);
    expect(env.out).toBe("sandbox\n");
    expect((await exec(s.id, ["sh", "-c", "exit 7"])).code).toBe(7);
    await t.request(DeleteSandboxDocument, { id: s.id });
  }, 300_000);

  it("restores a snapshot as a new sandbox whose guest carries on from the saved point", async () => {
    // This host has two vCPUs: the warm pool gives its guest back to make room for the source and the copy.
    await t.request(UpdateSandboxTemplateDocument, { id: templateId, input: { warm: 0 } });
    await until(
      "the warm guest drained",
      async () =>
        (await c.inspect((p) => p.db.prisma.instance.count({ where: { warmTemplateId: templateId, claimedAt: null, state: { not: "deleted" } } }))) === 0,
      120_000,
      250,
    );
    const { createSandbox: src } = await t.request(CreateSandboxDocument, { input: { templateId } });
    await until("the source running", async () => (await t.request(SandboxDocument, { id: src.id })).sandbox?.state === "RUNNING", 240_000, 100);
    await until("the guest counting", async () => (await counter(src.id).catch(() => 0)) > 20, 120_000, 200);
    const { createSandboxSnapshot: snap } = await t.request(CreateSandboxSnapshotDocument, { sandboxId: src.id });
    await until("the snapshot ready", async () => (await t.request(SandboxSnapshotDocument, { id: snap.id })).sandboxSnapshot?.state === "READY", 120_000, 200);
    const atSnapshot = await counter(src.id);
    await until("the source counting on", async () => (await counter(src.id)) > atSnapshot + 30, 60_000, 200);

    const t0 = performance.now();
    const { createSandbox: copy } = await t.request(CreateSandboxDocument, { input: { snapshotId: snap.id } });
    await until("the restored sandbox running", async () => (await t.request(SandboxDocument, { id: copy.id })).sandbox?.state === "RUNNING", 120_000, 20);
    console.log(`restore → RUNNING (polled): ${(performance.now() - t0).toFixed(0)} ms`);
    const restored = await counter(copy.id);
    // From about where it stood at the snapshot: not from zero, and well behind the source, which ran on.
    expect(restored).toBeGreaterThan(0);
    expect(restored).toBeLessThan((await counter(src.id)) - 20);
    for (const s of [src, copy]) await t.request(DeleteSandboxDocument, { id: s.id });
    await until(
      "every sandbox instance gone",
      async () => (await c.inspect((p) => p.db.prisma.instance.count({ where: { sandboxId: { not: null }, state: { not: "deleted" } } }))) === 0,
      120_000,
      250,
    );
    expect(await c.inspect((p) => invariantViolations(p))).toEqual([]);
  }, 600_000);
});
