import { join } from "node:path";
import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { clearFailures, injectFailure } from "../../agent/runtimes/fake/index.ts";
import { EXEC_OUTPUT_KEEP_MS, pruneExecOutput } from "../../core/sandboxes/exec.ts";
import { expireSandboxes } from "../../core/sandboxes/warm.ts";
import {
  CreatePoolDocument,
  CreateProviderAccountDocument,
  CreateSandboxDocument,
  CreateSandboxSnapshotDocument,
  CreateSandboxTemplateDocument,
  createWsClient,
  DeleteInstanceDocument,
  DeleteSandboxDocument,
  DeleteSandboxSnapshotDocument,
  DeleteSandboxTemplateDocument,
  ExtendSandboxDocument,
  InstanceDocument,
  InstanceEventsCursorDocument,
  InstancesDocument,
  ResizeInstanceDocument,
  SandboxDocument,
  SandboxEventsDocument,
  SandboxExecDocument,
  type SandboxExecSubscription,
  type SandboxExecSubscriptionVariables,
  SandboxesDocument,
  SandboxSnapshotDocument,
  SandboxSnapshotsDocument,
  SandboxTemplateDocument,
  SetTenantQuotaDocument,
  StartInstanceDocument,
  StopInstanceDocument,
  UpdateSandboxTemplateDocument,
} from "../../sdk/client.ts";
import { until } from "../support/fixtures.ts";
import { expectCode } from "../support/harness.ts";
import { type Hosts, startHosts } from "../support/hosts.ts";
import { invariantViolations } from "../support/ledger.ts";

/**
 * Sandboxes on simulated hosts (the fake runtime) through the real API, worker and host protocol: templates and
 * their refusals, cold starts, the instance guard, deadlines on an injected clock, warm pools (claims that never
 * share an instance, drains on a template update), and the books balancing after it all.
 */
let hosts: Hosts;
type Tenant = Awaited<ReturnType<Hosts["h"]["tenant"]>>;
let t: Tenant;

beforeAll(async () => {
  hosts = await startHosts(3, { SANDBOX_SWEEP_MS: "200", PROVIDERS: "hetzner-cloud" });
  t = await hosts.h.tenant();
});
afterAll(() => hosts?.close());

let n = 0;
const template = async (extra: Record<string, unknown> = {}, who: Tenant = t) =>
  (
    await who.client.request(CreateSandboxTemplateDocument, {
      input: { name: `tpl-${++n}`, poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId, ttlSeconds: 300, ...extra },
    })
  ).createSandboxTemplate;
const sandboxState = async (id: string) => (await t.client.request(SandboxDocument, { id })).sandbox?.state;
const waitSandbox = (id: string, state: string) => expect.poll(() => sandboxState(id), { timeout: 20_000, interval: 25 }).toBe(state);
const warmOf = async (id: string) => (await t.client.request(SandboxTemplateDocument, { id })).sandboxTemplate?.warm;
/** Another tenant subscribing to a sandbox's stream: refused as not found, as if it did not exist. */
async function expectSubscriptionNotFound<R, V extends Record<string, unknown>>(token: string, doc: TypedDocumentNode<R, V>, variables: V) {
  const ws = await createWsClient({ url: hosts.h.url, token, retryAttempts: 0 });
  try {
    const refused = (async () => {
      for await (const _ of ws.subscribe(doc, variables)) void _;
    })();
    await expect(refused).rejects.toMatchObject({ code: "NOT_FOUND" });
  } finally {
    await ws.dispose();
  }
}

describe("sandbox templates", () => {
  it("are checked, versioned, and another tenant's are not found", async () => {
    const tpl = await template({ env: [{ name: "MODE", value: "ci" }], network: { egress: "ALLOWLIST", allow: ["10.0.0.0/8:443/tcp", "1.1.1.1/32:*/udp"] } });
    expect(tpl).toMatchObject({
      version: 1,
      network: { egress: "ALLOWLIST", allow: ["10.0.0.0/8:443/tcp", "1.1.1.1/32:*/udp"] },
      env: [{ name: "MODE", value: "ci" }],
    });
    const updated = (await t.client.request(UpdateSandboxTemplateDocument, { id: tpl.id, input: { ttlSeconds: 600 } })).updateSandboxTemplate;
    expect(updated).toMatchObject({ version: 2, ttlSeconds: 600 });

    await expectCode(template({ name: tpl.name }), "CONFLICT");
    await expectCode(template({ flavor: "nope" }), "NOT_FOUND");
    await expectCode(template({ imageId: "img_nope" }), "NOT_FOUND");
    await expectCode(template({ network: { egress: "ALLOWLIST", allow: ["10.0.0.0/33:80/tcp"] } }), "INVALID_INPUT");
    await expectCode(template({ env: [{ name: "1BAD", value: "x" }] }), "INVALID_INPUT");
    await expectCode(template({ ttlSeconds: 600, maxTtlSeconds: 60 }), "INVALID_INPUT");
    const { createProviderAccount } = await hosts.h.operator.request(CreateProviderAccountDocument, {
      input: { name: "hz", provider: "hetzner-cloud", config: {}, credentials: { token: "env:HCLOUD_TOKEN" } },
    });
    const { createPool } = await hosts.h.operator.request(CreatePoolDocument, {
      input: { name: "hz", class: "PROVIDER", providerAccountId: createProviderAccount.id },
    });
    await expectCode(template({ poolId: createPool.id }), "UNSUPPORTED");

    const other = await hosts.h.tenant();
    expect((await other.client.request(SandboxTemplateDocument, { id: tpl.id })).sandboxTemplate).toBeNull();
    await expectCode(other.client.request(UpdateSandboxTemplateDocument, { id: tpl.id, input: { warm: 1 } }), "NOT_FOUND");
    await expectCode(other.client.request(CreateSandboxDocument, { input: { templateId: tpl.id } }), "NOT_FOUND");
    await t.client.request(DeleteSandboxTemplateDocument, { id: tpl.id });
  });

  it("bound a tenant's warm targets by its sandbox_warm quota (the deployment's default until the operator sets one)", async () => {
    const other = await hosts.h.tenant();
    const a = await template({ warm: 3 }, other);
    await expectCode(template({ warm: 2 }, other), "QUOTA_EXCEEDED");
    await hosts.h.operator.request(SetTenantQuotaDocument, { tenantId: other.id, quota: { sandboxWarm: 5 } });
    const b = await template({ warm: 2 }, other);
    await expectCode(other.client.request(UpdateSandboxTemplateDocument, { id: b.id, input: { warm: 3 } }), "QUOTA_EXCEEDED");
    for (const x of [a, b]) await other.client.request(DeleteSandboxTemplateDocument, { id: x.id });
  });
});

describe("sandboxes", () => {
  it("boot cold without a warm pool, own their instance, and go on delete", async () => {
    const tpl = await template({ env: [{ name: "GREETING", value: "hi" }] });
    const { createSandbox: s } = await t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id, idempotencyKey: "cold-1" } });
    expect(s).toMatchObject({ state: "CREATING", warm: false, templateVersion: 1 });
    const again = (await t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id, idempotencyKey: "cold-1" } })).createSandbox;
    expect(again.id).toBe(s.id);
    await expectCode(t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id, idempotencyKey: "cold-1", ttlSeconds: 5 } }), "CONFLICT");
    await waitSandbox(s.id, "RUNNING");
    const inst = (await t.client.request(InstanceDocument, { id: s.instance.id })).instance;
    expect(inst?.sandboxId).toBe(s.id);

    const id = inst?.id as string;
    for (const refused of [
      () => t.client.request(StopInstanceDocument, { id }),
      () => t.client.request(StartInstanceDocument, { id }),
      () => t.client.request(DeleteInstanceDocument, { id }),
      () => t.client.request(ResizeInstanceDocument, { id, flavor: "medium" }),
    ])
      await expectCode(refused(), "PRECONDITION_FAILED");

    await t.client.request(DeleteSandboxDocument, { id: s.id });
    await waitSandbox(s.id, "DELETED");
    const listed = (await t.client.request(SandboxesDocument, { templateId: tpl.id })).sandboxes;
    expect(listed.map((x) => x.id)).toEqual([s.id]);
  });

  it("expire at their deadline on the sandboxes reconciler's clock, and extend only within the template's maximum", async () => {
    const tpl = await template({ ttlSeconds: 60, maxTtlSeconds: 120 });
    const { createSandbox: s } = await t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id } });
    await expectCode(t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id, ttlSeconds: 121 } }), "INVALID_INPUT");
    await expectCode(t.client.request(ExtendSandboxDocument, { id: s.id, ttlSeconds: 500 }), "PRECONDITION_FAILED");
    const extended = (await t.client.request(ExtendSandboxDocument, { id: s.id, ttlSeconds: 90 })).extendSandbox;
    expect(new Date(extended.expiresAt).getTime()).toBeGreaterThan(new Date(s.expiresAt).getTime());

    const expire = (at: Date) => hosts.h.platform.write({ actor: "sandboxes" }, (w) => expireSandboxes(w, s.id, at));
    expect(await expire(new Date(new Date(extended.expiresAt).getTime() - 1000))).toBe(0);
    expect(await sandboxState(s.id)).not.toMatch(/DELET/);
    // The reconciler skips an instance another transaction holds (a report being applied): it is caught next round.
    await until("the sandbox expired", async () => (await expire(new Date(new Date(extended.expiresAt).getTime() + 1))) === 1);
    await waitSandbox(s.id, "DELETED");
    const reasons = await hosts.h.platform.read((sql) =>
      sql.query<{ reason: string }>(`SELECT reason FROM instance_events WHERE instance_id = $1`, [s.instance.id]),
    );
    expect(reasons.map((r) => r.reason)).toContain("sandbox:ttl");
  });
});

describe("sandbox events", () => {
  it("stream a sandbox's changes from a cursor, resumable with nothing missed or repeated, and only sandboxes'", async () => {
    const tpl = await template();
    const after = (await t.client.request(InstanceEventsCursorDocument)).instanceEventsCursor;
    const { createSandbox: s } = await t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id } });
    const ws = await createWsClient({ url: hosts.h.url, token: t.token, retryAttempts: 0 });
    try {
      const read = async (from: string, until: (e: { state: string }) => boolean) => {
        const seen: { cursor: string; sandboxId: string; state: string; instanceState: string }[] = [];
        for await (const m of ws.subscribe(SandboxEventsDocument, { after: from })) {
          seen.push(m.sandboxEvents);
          if (until(m.sandboxEvents)) break;
        }
        return seen;
      };
      const all = await read(after, (e) => e.state === "RUNNING");
      expect(all.every((e) => e.sandboxId === s.id)).toBe(true);
      expect(all.map((e) => e.instanceState)).toEqual(["pending", "scheduling", "provisioning", "starting", "running"]);
      const resumed = await read(all[1]?.cursor as string, (e) => e.state === "RUNNING");
      expect(resumed.map((e) => e.cursor)).toEqual(all.slice(2).map((e) => e.cursor));
      const other = await hosts.h.tenant();
      await expectSubscriptionNotFound(other.token, SandboxEventsDocument, { sandboxId: s.id });
    } finally {
      await ws.dispose();
    }
    await t.client.request(DeleteSandboxDocument, { id: s.id });
    await t.client.request(DeleteSandboxTemplateDocument, { id: tpl.id });
  });
});

describe("exec", () => {
  it("streams a command's output in order and then its exit code; the command sees the template's env", async () => {
    const tpl = await template({ env: [{ name: "GREETING", value: "hello from the template" }] });
    const { createSandbox: s } = await t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id } });
    await waitSandbox(s.id, "RUNNING");
    const ws = await createWsClient({ url: hosts.h.url, token: t.token, retryAttempts: 0 });
    try {
      const run = async (vars: Parameters<typeof ws.subscribe<SandboxExecSubscription, SandboxExecSubscriptionVariables>>[1]) => {
        const out: SandboxExecSubscription["sandboxExec"][] = [];
        for await (const m of ws.subscribe(SandboxExecDocument, vars)) out.push(m.sandboxExec);
        return out;
      };
      const script = 'for i in 1 2 3 4 5; do echo "out $i"; echo "err $i" >&2; done; echo "$GREETING/$EXTRA"; read line; echo "in:$line"; exit 3';
      const out = await run({ sandboxId: s.id, command: ["sh", "-c", script], env: [{ name: "EXTRA", value: "x" }], stdin: "typed\n" });
      const text = (stream: string) =>
        out
          .filter((o) => o.stream === stream)
          .map((o) => o.data)
          .join("");
      expect(text("STDOUT")).toBe("out 1\nout 2\nout 3\nout 4\nout 5\nhello from the template/x\nin:typed\n");
      expect(text("STDERR")).toBe("err 1\nerr 2\nerr 3\nerr 4\nerr 5\n");
      expect(out.at(-1)).toMatchObject({ stream: "EXIT", exitCode: 3, timedOut: false });
      expect(out.filter((o) => o.stream === "EXIT")).toHaveLength(1);

      // A guest the host cannot reach (libvirt: no QEMU guest agent; the host's report codes it `unsupported`) is a
      // typed refusal, not an exit code.
      for (const dir of hosts.dirs)
        injectFailure(join(dir, "fake-host"), "exec", {
          error: "domain has no QEMU guest agent: its domain has no agent channel",
          retryable: false,
          code: "unsupported",
          times: 1,
        });
      await expect(run({ sandboxId: s.id, command: ["true"] })).rejects.toMatchObject({ code: "UNSUPPORTED" });
      // Only the sandbox's host used its injection: the others' would fail a later test's exec.
      for (const dir of hosts.dirs) clearFailures(join(dir, "fake-host"));

      // Output is kept an hour after its command finished, then pruned.
      const kept = async () => (await hosts.h.platform.read((sql) => sql.query(`SELECT 1 FROM exec_output`))).length;
      expect(await kept()).toBeGreaterThan(0);
      const soon = new Date(Date.now() + 1000);
      expect(await hosts.h.platform.write({ actor: "sandboxes" }, (w) => pruneExecOutput(w, new Date(soon.getTime() - EXEC_OUTPUT_KEEP_MS)))).toBe(0);
      expect(await hosts.h.platform.write({ actor: "sandboxes" }, (w) => pruneExecOutput(w, soon))).toBeGreaterThan(0);
      expect(await kept()).toBe(0);

      const slow = await run({ sandboxId: s.id, command: ["sleep", "30"], timeoutSeconds: 1 });
      expect(slow.at(-1)).toMatchObject({ stream: "EXIT", exitCode: null, timedOut: true });

      const other = await hosts.h.tenant();
      await expectSubscriptionNotFound(other.token, SandboxExecDocument, { sandboxId: s.id, command: ["true"] });
    } finally {
      await ws.dispose();
    }
    await t.client.request(DeleteSandboxDocument, { id: s.id });
    await waitSandbox(s.id, "DELETED");
    const stopped = (async () => {
      const ws2 = await createWsClient({ url: hosts.h.url, token: t.token, retryAttempts: 0 });
      try {
        for await (const _ of ws2.subscribe(SandboxExecDocument, { sandboxId: s.id, command: ["true"] })) void _;
      } finally {
        await ws2.dispose();
      }
    })();
    await expect(stopped).rejects.toMatchObject({ code: "PRECONDITION_FAILED" });
    await t.client.request(DeleteSandboxTemplateDocument, { id: tpl.id });
  });
});

describe("sandbox snapshots", () => {
  it("save a sandbox on its host and restore it as a new sandbox there, with its lineage", async () => {
    const tpl = await template();
    const { createSandbox: src } = await t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id } });
    await waitSandbox(src.id, "RUNNING");
    const ws = await createWsClient({ url: hosts.h.url, token: t.token, retryAttempts: 0 });
    const exec = async (sandboxId: string, command: string[]) => {
      let out = "";
      for await (const m of ws.subscribe(SandboxExecDocument, { sandboxId, command })) out += m.sandboxExec.stream === "STDOUT" ? m.sandboxExec.data : "";
      return out;
    };
    try {
      await exec(src.id, ["sh", "-c", "echo before-snapshot > state.txt"]);
      const { createSandboxSnapshot: snap } = await t.client.request(CreateSandboxSnapshotDocument, { sandboxId: src.id });
      expect(snap).toMatchObject({ sandboxId: src.id, state: "CREATING" });
      await expectCode(t.client.request(CreateSandboxDocument, { input: { snapshotId: snap.id } }), "PRECONDITION_FAILED");
      await expect
        .poll(async () => (await t.client.request(SandboxSnapshotDocument, { id: snap.id })).sandboxSnapshot?.state, { timeout: 20_000 })
        .toBe("READY");
      await exec(src.id, ["sh", "-c", "echo after-snapshot > state.txt"]);

      const { createSandbox: copy } = await t.client.request(CreateSandboxDocument, { input: { snapshotId: snap.id } });
      expect(copy).toMatchObject({ fromSnapshotId: snap.id, templateId: tpl.id });
      await waitSandbox(copy.id, "RUNNING");
      const [a, b] = await Promise.all([src, copy].map(async (s) => (await t.client.request(SandboxDocument, { id: s.id })).sandbox));
      expect(b?.instance.nodeId).toBe(a?.instance.nodeId);
      expect(b?.instance.id).not.toBe(a?.instance.id);
      expect(await exec(copy.id, ["cat", "state.txt"])).toBe("before-snapshot\n");
      expect(await exec(src.id, ["cat", "state.txt"])).toBe("after-snapshot\n");
      const lineage = (await t.client.request(SandboxSnapshotsDocument, { sandboxId: src.id })).sandboxSnapshots;
      expect(lineage.map((x) => [x.id, x.restoredInto.map((r) => r.id)])).toEqual([[snap.id, [copy.id]]]);

      const other = await hosts.h.tenant();
      expect((await other.client.request(SandboxSnapshotDocument, { id: snap.id })).sandboxSnapshot).toBeNull();
      await expectCode(other.client.request(CreateSandboxDocument, { input: { snapshotId: snap.id } }), "NOT_FOUND");
      await t.client.request(DeleteSandboxSnapshotDocument, { id: snap.id });
      await expectCode(t.client.request(CreateSandboxDocument, { input: { snapshotId: snap.id } }), "PRECONDITION_FAILED");
      for (const s of [src, copy]) await t.client.request(DeleteSandboxDocument, { id: s.id });
    } finally {
      await ws.dispose();
    }
    await t.client.request(DeleteSandboxTemplateDocument, { id: tpl.id });
  });
});

describe("warm pools", () => {
  it("serve concurrent creates, each from its own instance, charging quota only at the claim", async () => {
    await hosts.h.operator.request(SetTenantQuotaDocument, { tenantId: t.id, quota: { sandboxWarm: 10 } });
    const tpl = await template({ warm: 10 });
    await until("ten warm instances ready", async () => (await warmOf(tpl.id))?.ready === 10, 30_000);
    // Warm instances are the operator's until claimed: neither the tenant's list nor its quota shows them.
    const mine = (await t.client.request(InstancesDocument, {})).instances.edges.map((e) => e.node.id);
    const warmIds = await hosts.h.platform.read((sql) => sql.query<{ id: string }>(`SELECT id FROM instances WHERE warm_template_id = $1`, [tpl.id]));
    expect(mine.filter((id) => warmIds.some((w) => w.id === id))).toEqual([]);

    // Fifty at once against ten warm: the rest boot cold while the hosts have room (UNSCHEDULABLE after).
    const made = await Promise.allSettled(Array.from({ length: 50 }, () => t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id } })));
    const ok = made.flatMap((r) => (r.status === "fulfilled" ? [r.value.createSandbox] : []));
    for (const r of made) if (r.status === "rejected") expect(["UNSCHEDULABLE", "QUOTA_EXCEEDED"]).toContain((r.reason as { code: string }).code);
    expect(new Set(ok.map((s) => s.instance.id)).size).toBe(ok.length);
    expect(ok.filter((s) => s.warm).length).toBeGreaterThanOrEqual(10);
    for (const s of ok.filter((x) => x.warm)) await waitSandbox(s.id, "RUNNING");
    const stats = await warmOf(tpl.id);
    expect(stats?.claims).toBe(ok.length);
    expect(stats?.hits).toBe(ok.filter((s) => s.warm).length);
    expect(stats?.claimP50Ms).toBeGreaterThan(0);
    for (const s of ok) await t.client.request(DeleteSandboxDocument, { id: s.id });
    await t.client.request(DeleteSandboxTemplateDocument, { id: tpl.id });
  });

  it("claim in the write path's lock order: node before quota, so a deletion freeing that node never deadlocks with it", async () => {
    const tpl = await template({ warm: 1 });
    await until("a warm instance ready", async () => (await warmOf(tpl.id))?.ready === 1, 30_000);
    const [warm] = await hosts.h.platform.read((sql) =>
      sql.query<{ nodeId: string }>(`SELECT node_id AS "nodeId" FROM instances WHERE warm_template_id = $1 AND claimed_at IS NULL`, [tpl.id]),
    );
    // A deletion's first step, as markDeleted takes it: the node's row (its allocation given back)...
    const other = new pg.Client({ connectionString: hosts.h.dbUrl });
    await other.connect();
    try {
      await other.query("BEGIN");
      await other.query(`UPDATE nodes SET alloc_vcpus = alloc_vcpus WHERE id = $1`, [warm?.nodeId]);
      const claiming = t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id } });
      await until("the claim to wait for the node", async () => {
        const [w] = await hosts.h.platform.read((sql) =>
          sql.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'UPDATE nodes%'`,
          ),
        );
        return (w?.n ?? 0) > 0;
      });
      // ...then the tenant's quota row. A claim holding that row while it waits for the node would make this
      // wait until PostgreSQL's deadlock check (1 s) ended one of the two; in order, nothing holds the row. The
      // timeout is below that check, so a wait fails here rather than being resolved as a deadlock.
      await other.query(`SET LOCAL lock_timeout = '500ms'`);
      await other.query(`UPDATE quota_usage SET used = used WHERE tenant_id = $1`, [t.id]);
      await other.query("COMMIT");
      const { createSandbox: s } = await claiming;
      expect(s.warm).toBe(true);
      await t.client.request(DeleteSandboxDocument, { id: s.id });
    } finally {
      await other.end();
    }
    await t.client.request(DeleteSandboxTemplateDocument, { id: tpl.id });
  });

  it("drain instances of an older version when the template changes, and replace them", async () => {
    const tpl = await template({ warm: 2 });
    await until("two warm instances ready", async () => (await warmOf(tpl.id))?.ready === 2, 30_000);
    const before = await hosts.h.platform.read((sql) => sql.query<{ id: string }>(`SELECT id FROM instances WHERE warm_template_id = $1`, [tpl.id]));
    await t.client.request(UpdateSandboxTemplateDocument, { id: tpl.id, input: { env: [{ name: "V", value: "2" }] } });
    await until("the new version's pool ready", async () => (await warmOf(tpl.id))?.ready === 2, 30_000);
    const states = await hosts.h.platform.read((sql) =>
      sql.query<{ id: string; desired: string; version: number }>(
        `SELECT id, desired_state AS desired, warm_template_version AS version FROM instances WHERE warm_template_id = $1`,
        [tpl.id],
      ),
    );
    for (const b of before) expect(states.find((s) => s.id === b.id)?.desired).toBe("deleted");
    expect(states.filter((s) => s.desired === "paused").every((s) => s.version === 2)).toBe(true);
    const { createSandbox: s } = await t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id } });
    expect(s).toMatchObject({ warm: true, templateVersion: 2 });
    await t.client.request(DeleteSandboxDocument, { id: s.id });
    await t.client.request(DeleteSandboxTemplateDocument, { id: tpl.id });
  });

  it("leave nothing behind: the books balance once everything is deleted", async () => {
    await until(
      "every instance deleted",
      async () => (await hosts.h.platform.read((sql) => sql.query(`SELECT 1 FROM instances WHERE state <> 'deleted'`))).length === 0,
      30_000,
    ).catch(async (e) => {
      const left = await hosts.h.platform.read((sql) =>
        sql.query(`SELECT id, state, desired_state, warm_template_id, sandbox_id, conditions FROM instances WHERE state <> 'deleted'`),
      );
      throw new Error(`${e.message}: ${JSON.stringify(left)}`);
    });
    await until(
      "every instance deleted",
      async () => (await hosts.h.platform.read((sql) => sql.query(`SELECT 1 FROM instances WHERE state <> 'deleted'`))).length === 0,
      30_000,
    );
    expect(await invariantViolations(hosts.h.platform)).toEqual([]);
  });
});
