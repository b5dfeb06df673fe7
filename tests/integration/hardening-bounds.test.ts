import { execFile } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Principal } from "../../core/auth/principal.ts";
import { readExec, requestExec } from "../../core/sandboxes/exec.ts";
import { deleteSandbox } from "../../core/sandboxes/sandboxes.ts";
import {
  CreateSandboxDocument,
  CreateSandboxTemplateDocument,
  createClient,
  createWsClient,
  DeleteSandboxDocument,
  ReportExecOutputDocument,
  SandboxDocument,
  SandboxExecDocument,
  type SandboxExecSubscriptionVariables,
} from "../../sdk/client.ts";
import * as generated from "../../sdk/generated.ts";
import { sdkOperations } from "../../server/metrics.ts";
import { until } from "../support/fixtures.ts";
import { expectCode } from "../support/harness.ts";
import { type Hosts, startHosts } from "../support/hosts.ts";

/**
 * Issue 42, the bounds the probe found missing, through the real server, worker, PostgreSQL and simulated hosts:
 * metric labels a client cannot multiply, exec output capped per exec and per tenant (whatever a host sends),
 * no exec queued after its sandbox's delete, impossible dates refused, and `bc login`'s file its owner's alone.
 */
const EXEC_CAP = 65_536;
const TENANT_CAP = 163_840;
let hosts: Hosts;
type Tenant = Awaited<ReturnType<Hosts["h"]["tenant"]>>;
let t: Tenant;

beforeAll(async () => {
  hosts = await startHosts(2, {
    SANDBOX_EXEC_OUTPUT_BYTES: String(EXEC_CAP),
    SANDBOX_TENANT_EXEC_OUTPUT_BYTES: String(TENANT_CAP),
    SANDBOX_EXECS_PER_SANDBOX: "2",
  });
  t = await hosts.h.tenant();
});
afterAll(() => hosts?.close());

const rows = <T>(text: string, params: unknown[] = []) => hosts.h.platform.read((sql) => sql.query<T>(text, params));
const principal = (x: Tenant): Principal => ({ identityId: x.identityId, tenantId: x.id, operator: false, scopes: new Set() });

/** Sandboxes of `who`, running. */
async function sandboxes(n: number, who = t): Promise<{ id: string; instanceId: string }[]> {
  const { createSandboxTemplate: tpl } = await who.client.request(CreateSandboxTemplateDocument, {
    input: { name: `bounds-${Math.random().toString(36).slice(2)}`, poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId, ttlSeconds: 600 },
  });
  const templateId = tpl.id;
  const made = await Promise.all(
    Array.from({ length: n }, async () => (await who.client.request(CreateSandboxDocument, { input: { templateId } })).createSandbox.id),
  );
  const running: { id: string; instanceId: string }[] = [];
  for (const id of made)
    await until(
      `${id} running`,
      async () => {
        const s = (await who.client.request(SandboxDocument, { id })).sandbox;
        if (s?.state === "RUNNING") running.push({ id, instanceId: s.instance.id });
        return s?.state === "RUNNING";
      },
      30_000,
    );
  return running;
}

async function exec(token: string, vars: SandboxExecSubscriptionVariables) {
  const ws = await createWsClient({ url: hosts.h.url, token, retryAttempts: 0 });
  try {
    const out: { stream: string; data: string | null; exitCode: number | null }[] = [];
    for await (const m of ws.subscribe(SandboxExecDocument, vars)) out.push(m.sandboxExec);
    return out;
  } finally {
    await ws.dispose();
  }
}

const execCommands = (instanceId: string) =>
  rows<{ id: string; nodeId: string; finished: boolean; result: { output?: { bytes: number; truncated: boolean } } | null }>(
    `SELECT id, node_id AS "nodeId", finished_at IS NOT NULL AS finished, result FROM host_commands WHERE instance_id = $1 AND kind = 'instance.exec' ORDER BY created_at`,
    [instanceId],
  );
/** What an exec's output costs as stored, as the cap counts it (64 per row), and its data's bytes. */
const stored = async (commandId: string) =>
  (
    await rows<{ cost: number; data: number; n: number }>(
      `SELECT COALESCE(sum(octet_length(data) + 64), 0)::int AS cost, COALESCE(sum(octet_length(data)), 0)::int AS data, count(*)::int AS n FROM exec_output WHERE command_id = $1`,
      [commandId],
    )
  )[0] as { cost: number; data: number; n: number };

describe("metric labels", () => {
  const gql = (query: string, body: Record<string, unknown> = {}) =>
    fetch(hosts.h.url, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${hosts.h.operatorToken}` },
      body: JSON.stringify({ query, ...body }),
    });
  const series = async () => {
    const text = await (await fetch(hosts.h.url.replace(/\/graphql$/, "/metrics"))).text();
    return { text, graphql: text.split("\n").filter((l) => l.startsWith("bc_graphql_")) };
  };

  it("name an operation only when the SDK or the schema knows the name: hundreds of made-up names add no series", async () => {
    // The names counted are the SDK's own documents', as the generated client exports them.
    const exported = Object.values(generated as Record<string, unknown>).flatMap((d) =>
      ((d as { definitions?: readonly { kind: string; name?: { value: string } }[] }).definitions ?? [])
        .filter((x) => x.kind === "OperationDefinition")
        .map((x) => x.name?.value),
    );
    expect([...sdkOperations().keys()].sort()).toEqual([...new Set(exported)].sort());

    await gql("query Viewer { viewer { identityId } }");
    await gql("query madeUp_0 { viewer { identityId } }");
    const before = await series();
    for (let i = 1; i <= 300; i++) await gql(`query madeUp_${i} { viewer { identityId } }`);
    await gql("query CreateInstance { viewer { identityId } }"); // the SDK's name of a mutation, as a query: other
    await gql("query instances { viewer { identityId } }"); // a root field's name, for clients without the SDK
    await gql("query Viewer { viewer { identityId } }");
    const after = await series();
    expect(after.text).not.toMatch(/madeUp_|operation="CreateInstance",type="query"/);
    // The hosts' own requests (heartbeats) run meanwhile: the page grows by the new known series at most.
    const others = (x: { graphql: string[] }) => x.graphql.filter((l) => l.includes('operation="other"')).length;
    expect(others(after)).toBe(others(before));
    expect(after.text.length - before.text.length).toBeLessThan(8 * 1024);
    expect(after.text).toMatch(/^bc_graphql_requests_total\{operation="Viewer",type="query",outcome="ok"\} 2$/m);
    expect(after.text).toMatch(/^bc_graphql_requests_total\{operation="other",type="query",outcome="ok"\} 302$/m);
    expect(after.text).toMatch(/^bc_graphql_request_duration_seconds_count\{operation="other",type="query"\} 302$/m);
    expect(after.text).toMatch(/^bc_graphql_requests_total\{operation="instances",type="query",outcome="ok"\} 1$/m);
  });
});

describe("exec output", () => {
  it("is stored up to the cap per exec, whatever the host sends, and the exec's end says it was truncated", async () => {
    const [s] = (await sandboxes(1)) as [{ id: string; instanceId: string }];
    const out = await exec(t.token, { sandboxId: s.id, command: ["sh", "-c", "head -c 400000 /dev/zero | tr '\\0' x; echo done >&2"] });
    expect(out.at(-1)).toMatchObject({ stream: "EXIT", exitCode: 0 });
    const text = out.map((o) => (o.stream === "EXIT" ? "" : o.data)).join("");
    expect(text).toMatch(/^x+\n\[output truncated: an exec keeps at most 65536 bytes\]\n$/);
    const [cmd] = await execCommands(s.instanceId);
    if (!cmd?.result) throw new Error("no exec command, or no result");
    const kept = await stored(cmd.id);
    expect(kept.cost).toBeLessThanOrEqual(EXEC_CAP);
    expect(kept.cost).toBeGreaterThan(EXEC_CAP - 512);
    expect(cmd.result.output).toEqual({ bytes: kept.cost, truncated: true });
    expect(cmd.result).toMatchObject({ exitCode: 0, timedOut: false });
    const end = await hosts.h.platform.read((sql) => readExec(sql, cmd.id, 1_000_000, new Date()));
    expect(end.end).toMatchObject({ result: { exitCode: 0 }, truncated: true });

    // The host keeps sending, as a host may: nothing more is stored, and no audit row is written for it.
    const dir = hosts.dirs.find((d) => JSON.parse(readFileSync(join(d, "agent.json"), "utf8")).nodeId === cmd.nodeId) as string;
    const host = createClient({ url: hosts.h.url, token: JSON.parse(readFileSync(join(dir, "agent.json"), "utf8")).credential });
    const audits = async () => (await rows(`SELECT 1 FROM audit_log WHERE target_id = $1`, [cmd.id])).length;
    const audited = await audits();
    const chunks = Array.from({ length: 1000 }, (_, i) => ({ seq: 5000 + i, stream: "stdout", data: "y".repeat(1000) }));
    for (let i = 0; i < 3; i++) expect((await host.request(ReportExecOutputDocument, { commandId: cmd.id, chunks })).reportExecOutput).toBe(true);
    expect(await stored(cmd.id)).toEqual(kept);
    expect(await audits()).toBe(audited);
    await expectCode(
      host.request(ReportExecOutputDocument, { commandId: cmd.id, chunks: [{ seq: 2 ** 31 - 1, stream: "stdout", data: "z" }] }),
      "INVALID_INPUT",
    );

    // A host sending on another exec, tiny chunks and a batch twice: each chunk counted once, with its row, up to the cap.
    const small = await exec(t.token, { sandboxId: s.id, command: ["true"] });
    expect(small.at(-1)).toMatchObject({ stream: "EXIT", exitCode: 0 });
    const other = (await execCommands(s.instanceId)).at(-1) as { id: string };
    const batch = Array.from({ length: 200 }, (_, i) => ({ seq: 100 + i, stream: i % 2 ? "stderr" : "stdout", data: "é" }));
    await host.request(ReportExecOutputDocument, { commandId: other.id, chunks: batch });
    await host.request(ReportExecOutputDocument, { commandId: other.id, chunks: batch });
    expect(await stored(other.id)).toEqual({ cost: 200 * 66, data: 400, n: 200 });
    for (let b = 0; b < 5; b++)
      await host.request(ReportExecOutputDocument, {
        commandId: other.id,
        chunks: Array.from({ length: 1000 }, (_, i) => ({ seq: 1000 + b * 1000 + i, stream: "stdout", data: "a" })),
      });
    const tiny = await stored(other.id);
    expect(tiny.cost).toBeLessThanOrEqual(EXEC_CAP);
    expect(tiny.n).toBeLessThan(EXEC_CAP / 64);
    expect(((await execCommands(s.instanceId)).at(-1) as { result: unknown }).result).toMatchObject({ output: { bytes: tiny.cost, truncated: true } });
    await t.client.request(DeleteSandboxDocument, { id: s.id });
  });

  it("kept per tenant is bounded: a new exec is refused while kept output and running execs leave no room", async () => {
    const t2 = await hosts.h.tenant();
    const [s] = (await sandboxes(1, t2)) as [{ id: string; instanceId: string }];
    const caps = hosts.h.platform.config.sandboxes;
    const run = (command: string[], timeoutSeconds = 60) =>
      hosts.h.platform.write({ actor: t2.identityId, action: "sandboxExec" }, (w) => requestExec(w, principal(t2), s.id, { command, timeoutSeconds }, caps));
    // One exec's output kept (at the cap), one exec running (counted at the cap): 131072 + 65536 > 163840.
    const big = await run(["sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x"]);
    await until("the big exec finished", async () => (await execCommands(s.instanceId)).every((c) => c.finished), 20_000);
    expect((await stored(big.commandId)).cost).toBeGreaterThan(EXEC_CAP - 512);
    await run(["sleep", "30"], 30);
    const audits = async () => (await rows(`SELECT 1 FROM audit_log WHERE target_id = $1`, [s.id])).length;
    const audited = await audits();
    const refused = await expectCode(run(["true"]), "RATE_LIMITED");
    expect(refused.message).toMatch(/exec output/);
    expect(await execCommands(s.instanceId)).toHaveLength(2);
    expect(await audits()).toBe(audited);
    const kept = await rows<{ n: number }>(
      `SELECT COALESCE(sum(octet_length(o.data)), 0)::int AS n FROM exec_output o JOIN host_commands c ON c.id = o.command_id JOIN sandboxes s ON s.instance_id = c.instance_id WHERE s.tenant_id = $1`,
      [t2.id],
    );
    expect(kept[0]?.n).toBeLessThanOrEqual(TENANT_CAP);
    await t2.client.request(DeleteSandboxDocument, { id: s.id });
  });
});

describe("execs at once", () => {
  it("are bounded per sandbox: past the bound RATE_LIMITED, nothing queued, and a place frees as one ends", async () => {
    const t3 = await hosts.h.tenant();
    const [s] = (await sandboxes(1, t3)) as [{ id: string; instanceId: string }];
    const caps = hosts.h.platform.config.sandboxes;
    const run = (command: string[], timeoutSeconds = 60) =>
      hosts.h.platform.write({ actor: t3.identityId, action: "sandboxExec" }, (w) => requestExec(w, principal(t3), s.id, { command, timeoutSeconds }, caps));
    await run(["sleep", "30"], 30);
    const short = await run(["true"]);
    const third = await expectCode(run(["true"]), "RATE_LIMITED");
    expect(third.message).toMatch(/runs 2 execs already/);
    expect(await execCommands(s.instanceId)).toHaveLength(2);
    await until("the short exec finished", async () => (await execCommands(s.instanceId)).some((c) => c.id === short.commandId && c.finished), 20_000);
    await run(["true"]);
    expect(await execCommands(s.instanceId)).toHaveLength(3);
    await t3.client.request(DeleteSandboxDocument, { id: s.id });
  });
});

describe("an exec and its sandbox's delete", () => {
  it("is refused when it comes after the delete, every time, alone or racing it", async () => {
    const list = await sandboxes(12);
    const outcome = async (s: { id: string; instanceId: string }) => {
      const audit = await rows<{ action: string }>(
        `SELECT action FROM audit_log WHERE target_id = $1 AND action IN ('sandboxExec', 'deleteSandbox') ORDER BY id`,
        [s.id],
      );
      return { actions: audit.map((a) => a.action), commands: (await execCommands(s.instanceId)).length };
    };
    // After the delete's answer: refused, through the API.
    for (const s of list.slice(0, 6)) {
      await t.client.request(DeleteSandboxDocument, { id: s.id });
      await expect(exec(t.token, { sandboxId: s.id, command: ["true"] })).rejects.toMatchObject({ code: "PRECONDITION_FAILED" });
      expect(await outcome(s)).toEqual({ actions: ["deleteSandbox"], commands: 0 });
    }
    // At once: whichever commits first, an exec is queued only before the delete, never after it.
    const who = principal(t);
    await Promise.all(
      list.slice(6).map(async (s) => {
        const [del, ex] = await Promise.allSettled([
          hosts.h.platform.write({ actor: t.identityId, action: "deleteSandbox" }, (w) => deleteSandbox(w, who, s.id)),
          hosts.h.platform.write({ actor: t.identityId, action: "sandboxExec" }, (w) => requestExec(w, who, s.id, { command: ["true"] })),
        ]);
        expect(del.status).toBe("fulfilled");
        const { actions, commands } = await outcome(s);
        if (ex.status === "rejected") {
          expect(ex.reason).toMatchObject({ code: "PRECONDITION_FAILED" });
          expect({ actions, commands }).toEqual({ actions: ["deleteSandbox"], commands: 0 });
        } else expect({ actions, commands }).toEqual({ actions: ["sandboxExec", "deleteSandbox"], commands: 1 });
      }),
    );
  });
});

describe("DateTime", () => {
  it("refuses dates that do not exist, inline or as a variable, as INVALID_INPUT", async () => {
    const post = async (query: string, variables?: Record<string, unknown>) => {
      const res = await fetch(hosts.h.url, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${hosts.h.operatorToken}` },
        body: JSON.stringify({ query, variables }),
      });
      return (await res.json()) as { data?: unknown; errors?: { extensions?: { code?: string } }[] };
    };
    const inline = (from: string) => post(`{ usage(from: "${from}", to: "2031-01-01T00:00:00Z") { quantity } }`);
    const variable = (from: string) => post('query ($from: DateTime!) { usage(from: $from, to: "2031-01-01T00:00:00Z") { quantity } }', { from });
    for (const bad of ["2030-02-30T00:00:00Z", "2030-02-30", "2030-01-01T24:00:00Z", "2030-13-01T00:00:00Z", "2029-02-29T12:00:00+01:00"]) {
      for (const r of [await inline(bad), await variable(bad)]) {
        expect(r.data ?? null).toBeNull();
        expect(r.errors?.map((e) => e.extensions?.code)).toEqual(["INVALID_INPUT"]);
      }
    }
    for (const good of ["2030-02-28T00:00:00Z", "2028-02-29T23:59:59.5+01:00"])
      for (const r of [await inline(good), await variable(good)]) expect(r).toEqual({ data: { usage: [] } });
  });
});

describe("bc login", () => {
  it("leaves the config file its owner's alone (0600) even where one was there before, replaced whole", async () => {
    const home = mkdtempSync(join(tmpdir(), "bc-login-"));
    try {
      const path = join(home, "bc", "config.json");
      mkdirSync(join(home, "bc"));
      writeFileSync(path, '{ "url": "http://old.invalid/graphql", "token": "old" }\n');
      chmodSync(path, 0o644);
      const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !["BC_URL", "BC_TOKEN", "OPERATOR_TOKEN"].includes(k)));
      const code = await new Promise<number>((resolve) =>
        execFile(process.execPath, ["bin/bc.mjs", "login", "--url", hosts.h.url, "--token", t.token], { env: { ...clean, XDG_CONFIG_HOME: home } }, (e) =>
          resolve(e ? Number(e.code ?? 1) : 0),
        ),
      );
      expect(code).toBe(0);
      expect(statSync(path).mode & 0o777).toBe(0o600);
      expect(JSON.parse(readFileSync(path, "utf8"))).toEqual({ url: hosts.h.url, token: t.token });
      expect(readdirSync(join(home, "bc"))).toEqual(["config.json"]);
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });
});
