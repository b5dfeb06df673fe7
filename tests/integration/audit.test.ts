import { randomUUID } from "node:crypto";
import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { reconcileOnce } from "../../core/lifecycle/reconciler.ts";
import { requestExec } from "../../core/sandboxes/exec.ts";
import * as bc from "../../sdk/client.ts";
import { schema } from "../../server/schema/index.ts";
import { testKey } from "../support/fixtures.ts";
import { expectCode, type Harness, startHarness } from "../support/harness.ts";
import { walk } from "../support/reconcile.ts";

/**
 * The audit trail covers every mutation: this walks the schema's Mutation type and runs each mutation once, as
 * a client would, with a request id of its own, then expects exactly one audit row for that request naming the
 * mutation and who called it. A mutation added to the schema without a step here fails the first test; one
 * whose resolver bypasses the write path fails the second.
 */

let h: Harness;
beforeAll(async () => {
  h = await startHarness({ PROVIDERS: "hetzner-cloud" });
  await runEveryMutation();
});
afterAll(() => h?.close());

interface Call {
  mutation: string;
  requestId: string;
  actor: string;
}
const calls: Call[] = [];

/** A client whose every request carries a fresh request id, recorded against the mutation it runs. */
function as(token: string | undefined, actor: string) {
  return <R, V extends Record<string, unknown>>(mutation: string, doc: TypedDocumentNode<R, V>, vars: V): Promise<R> => {
    const requestId = randomUUID();
    calls.push({ mutation, requestId, actor });
    return bc.createClient({ url: h.url, token, headers: { "x-request-id": requestId } }).request<R, V>(doc, ...([vars] as never));
  };
}

async function auditRows(requestId: string) {
  return h.platform.read((sql) =>
    sql.query<{ action: string; actor: string; target: string | null }>(
      `SELECT action, actor_id AS actor, target_id AS target FROM audit_log WHERE request_id = $1`,
      [requestId],
    ),
  );
}

/** Every mutation, once, in an order where each finds what it needs. */
async function runEveryMutation() {
  const op = as(h.operatorToken, "idn_operator");
  const { createTenant: tenant } = await op("createTenant", bc.CreateTenantDocument, { input: { name: "audited" } });
  const { createApiToken: made } = await op("createApiToken", bc.CreateApiTokenDocument, { input: { tenantId: tenant.id, name: "t" } });
  const me = as(made.token, made.apiToken.identityId);
  await op("setTenantQuota", bc.SetTenantQuotaDocument, { tenantId: tenant.id, quota: { vcpus: 64 } });
  await me("createProject", bc.CreateProjectDocument, { name: "web" });
  const { createPool: pool } = await op("createPool", bc.CreatePoolDocument, { input: { name: "audit", class: "VPS_HOST", ipv4Range: "10.31.0.0/24" } });
  const { createNode: manual } = await op("createNode", bc.CreateNodeDocument, {
    input: { poolId: pool.id, name: "manual", capacity: { vcpus: 4, memoryMib: 4096, diskGib: 100 } },
  });
  await op("setNodeCapacity", bc.SetNodeCapacityDocument, { id: manual.id, capacity: { vcpus: 8, memoryMib: 8192, diskGib: 100 } });
  // Cordoned, so instances go to the joined host, whose credential this test holds.
  await op("setNodeState", bc.SetNodeStateDocument, { id: manual.id, state: "CORDONED" });
  const { createJoinToken: jt } = await op("createJoinToken", bc.CreateJoinTokenDocument, { poolId: pool.id });
  const { joinNode: joined } = await as(undefined, "anonymous")("joinNode", bc.JoinNodeDocument, { token: jt.token, name: "joined" });
  const host = as(joined.credential, `node:${joined.nodeId}`);
  const capacity = { vcpus: 16, memoryMib: 32768, diskGib: 500, gpus: [] };
  await host("reportStatus", bc.ReportStatusDocument, { report: { generation: 0, instances: [], capacity } });
  const { createFlavor: small } = await op("createFlavor", bc.CreateFlavorDocument, {
    input: { poolId: pool.id, name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 },
  });
  await op("updateFlavor", bc.UpdateFlavorDocument, { id: small.id, input: { memoryMib: 2048 } });
  await as(h.operatorToken, "idn_operator")("createFlavor", bc.CreateFlavorDocument, {
    input: { poolId: pool.id, name: "medium", vcpus: 2, memoryMib: 4096, diskGib: 20 },
  });
  const { createFlavor: spare } = await as(h.operatorToken, "idn_operator")("createFlavor", bc.CreateFlavorDocument, {
    input: { poolId: pool.id, name: "spare", vcpus: 1, memoryMib: 512, diskGib: 5 },
  });
  await op("deleteFlavor", bc.DeleteFlavorDocument, { id: spare.id });
  const { registerImage: image } = await me("registerImage", bc.RegisterImageDocument, {
    input: { name: "mine", source: "https://images.invalid/mine.qcow2", sha256: "c".repeat(64), format: "QCOW2" },
  });

  const { createInstance: vm } = await me("createInstance", bc.CreateInstanceDocument, {
    input: { poolId: pool.id, flavor: "small", imageId: image.id, sshKeys: [testKey()], idempotencyKey: "vm" },
  });
  await walk(h.platform, vm.id, ["scheduling", "provisioning", "starting", "running"]);
  await me("stopInstance", bc.StopInstanceDocument, { id: vm.id });
  await me("startInstance", bc.StartInstanceDocument, { id: vm.id });
  await me("pauseInstance", bc.PauseInstanceDocument, { id: vm.id });

  const { snapshotInstance: snap } = await op("snapshotInstance", bc.SnapshotInstanceDocument, { id: vm.id });
  const { nodeCommands } = await firstCommand(joined.credential, "instance.snapshot");
  const command = nodeCommands.command as { id: string };
  await host("reportCommand", bc.ReportCommandDocument, { report: { id: command.id, state: "succeeded", result: { sizeBytes: 1234 } } });
  await h.platform.write({ actor: "reconciler" }, (w) => reconcileOnce(w, h.platform.drivers, vm.id));
  expect((await bc.createClient({ url: h.url, token: h.operatorToken }).request(bc.InstanceSnapshotDocument, { id: snap.id })).instanceSnapshot).toMatchObject({
    state: "READY",
    sizeBytes: 1234,
  });
  await op("restoreInstance", bc.RestoreInstanceDocument, { id: vm.id, snapshotId: snap.id });

  // Sandboxes: a template, a sandbox (booted cold on the joined host), an exec's output, and their ends.
  const { createSandboxTemplate: tpl } = await me("createSandboxTemplate", bc.CreateSandboxTemplateDocument, {
    input: { name: "ci", poolId: pool.id, flavor: "small", imageId: image.id, ttlSeconds: 600, env: [{ name: "CI", value: "1" }] },
  });
  await me("updateSandboxTemplate", bc.UpdateSandboxTemplateDocument, { id: tpl.id, input: { ttlSeconds: 900 } });
  const { createSandbox: sbx } = await me("createSandbox", bc.CreateSandboxDocument, { input: { templateId: tpl.id, idempotencyKey: "sbx" } });
  await walk(h.platform, sbx.instance.id, ["scheduling", "provisioning", "starting", "running"]);
  await me("extendSandbox", bc.ExtendSandboxDocument, { id: sbx.id, ttlSeconds: 1200 });
  const principal = { identityId: made.apiToken.identityId, tenantId: tenant.id, operator: false, scopes: new Set(["compute:sandboxes:exec"] as const) };
  const exec = await h.platform.write({ actor: "test" }, (w) => requestExec(w, principal, sbx.id, { command: ["true"] }));
  await host("reportExecOutput", bc.ReportExecOutputDocument, { commandId: exec.commandId, chunks: [{ seq: 0, stream: "stdout", data: "ok\n" }] });
  const { createSandboxSnapshot: ssnap } = await me("createSandboxSnapshot", bc.CreateSandboxSnapshotDocument, { sandboxId: sbx.id });
  await me("deleteSandboxSnapshot", bc.DeleteSandboxSnapshotDocument, { id: ssnap.id });
  await me("deleteSandbox", bc.DeleteSandboxDocument, { id: sbx.id });
  await me("deleteSandboxTemplate", bc.DeleteSandboxTemplateDocument, { id: tpl.id });

  const { createInstance: stopped } = await me("createInstance", bc.CreateInstanceDocument, {
    input: { poolId: pool.id, flavor: "small", imageId: image.id, desiredState: "STOPPED", idempotencyKey: "stopped" },
  });
  await walk(h.platform, stopped.id, ["scheduling", "provisioning", "stopped"]);
  await me("resizeInstance", bc.ResizeInstanceDocument, { id: stopped.id, flavor: "medium" });
  await me("deleteInstance", bc.DeleteInstanceDocument, { id: stopped.id });

  const { createProviderAccount: acct } = await op("createProviderAccount", bc.CreateProviderAccountDocument, {
    input: { name: "hz", provider: "hetzner-cloud", config: {}, credentials: { token: "env:HCLOUD_TOKEN" } },
  });
  await op("deleteProviderAccount", bc.DeleteProviderAccountDocument, { id: acct.id });
  await op("revokeApiToken", bc.RevokeApiTokenDocument, { id: made.apiToken.id });
  await op("declareNodeGone", bc.DeclareNodeGoneDocument, { id: manual.id });
  const { createTenant: leaving } = await op("createTenant", bc.CreateTenantDocument, { input: { name: "leaving" } });
  await op("deleteTenant", bc.DeleteTenantDocument, { id: leaving.id });
}

/** The first command on a node's command stream. */
/** The first command of `kind` on the node's stream (a pause, say, may come before the snapshot asked for). */
async function firstCommand(credential: string, kind: string) {
  const ws = await bc.createWsClient({ url: h.url, token: credential, retryAttempts: 0 });
  try {
    for await (const payload of ws.subscribe(bc.NodeCommandsDocument)) if ((payload.nodeCommands.command as { kind?: string }).kind === kind) return payload;
    throw new Error(`the command stream ended without a ${kind} command`);
  } finally {
    await ws.dispose();
  }
}

describe("the audit trail", () => {
  it("has a step here for every mutation of the schema", () => {
    const mutations = Object.keys(schema.getMutationType()?.getFields() ?? {}).sort();
    const covered = new Set(calls.map((c) => c.mutation));
    expect(mutations.filter((m) => !covered.has(m))).toEqual([]);
  });

  it("holds exactly one row per successful mutation, naming it and its caller", async () => {
    expect(calls.length).toBeGreaterThan(20);
    for (const c of calls) {
      const rows = await auditRows(c.requestId);
      expect(
        rows.map((r) => [r.action, r.actor]),
        `${c.mutation} (request ${c.requestId})`,
      ).toEqual([[c.mutation, c.actor]]);
      expect(rows[0]?.target, c.mutation).toBeTruthy();
    }
  });

  it("holds no row for a refused mutation, nor for one that changed nothing", async () => {
    const op = (requestId: string) => bc.createClient({ url: h.url, token: h.operatorToken, headers: { "x-request-id": requestId } });
    const refused = randomUUID();
    await expectCode(op(refused).request(bc.CreatePoolDocument, { input: { name: "bad", class: "VPS_HOST", ipv4Range: "10.0.0.0/8" } }), "INVALID_INPUT");
    const t = await h.tenant();
    const pool = await h.hostedPool({ ipv4Range: "10.32.0.0/24" });
    const { createInstance: vm } = await t.client.request(bc.CreateInstanceDocument, {
      input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, idempotencyKey: "same" },
    });
    const repeat = randomUUID();
    await op(repeat).request(bc.StartInstanceDocument, { id: vm.id });
    const replay = randomUUID();
    await bc
      .createClient({ url: h.url, token: t.token, headers: { "x-request-id": replay } })
      .request(bc.CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, idempotencyKey: "same" } });
    for (const id of [refused, repeat, replay]) expect(await auditRows(id)).toEqual([]);
  });
});
