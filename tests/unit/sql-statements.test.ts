import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import type { Principal } from "../../core/auth/principal.ts";
import { tableImages } from "../../core/catalog/images.ts";
import { enqueueCommand } from "../../core/commands/commands.ts";
import { powerReportChange, queuePowerWithChange } from "../../core/commands/power.ts";
import { registerBuiltInDrivers } from "../../core/drivers.ts";
import { changeStatement } from "../../core/instances/changes.ts";
import type { Instance } from "../../core/instances/model.ts";
import type { Sql } from "../../core/kernel/db.ts";
import type { IdSource } from "../../core/kernel/ids.ts";
import { sealer } from "../../core/kernel/seal.ts";
import type { Fragment } from "../../core/kernel/sql.ts";
import { closingStatement, Write } from "../../core/kernel/write.ts";
import { type AdmissionDeps, type AdmitOptions, createOf, planAdmission } from "../../core/lifecycle/admission.ts";
import { type Admission, admissionStatement, lookupStatement } from "../../core/lifecycle/admission-sql.ts";
import type { Catalog } from "../../core/lifecycle/lookup.ts";
import { powerRequestChange } from "../../core/lifecycle/power-requests.ts";

/**
 * The statements on the platform's hot paths, rendered for two different inputs: each must be one text whatever
 * its values (they are PREPAREd once per connection, keyed by their text), and the SQL they were before SQL became
 * values (issue 43). fixtures/statements-before.json holds what the code sent then for these same inputs. Where the
 * text is the same, it must be byte for byte; where placeholders are now numbered in the order they appear, the
 * statement with every placeholder replaced by its value must be what it was.
 */
const before = JSON.parse(readFileSync(new URL("./fixtures/statements-before.json", import.meta.url), "utf8")) as Record<
  string,
  { text: string; params: unknown[] }[]
>;

/** Statements whose text did not change at all. */
const IDENTICAL = new Set(["audit.row", "audit.rowWithDeferred"]);

registerBuiltInDrivers();

/** Building these statements sends nothing: a statement sent here would be a test that no longer means this. */
const silent = new Proxy({} as Sql, {
  get: (_, k) => (k === "commitWith" ? async () => [] : () => Promise.reject(new Error(`a statement was sent while building (${String(k)})`))),
});

function writeOf(v: number, action?: string) {
  const counters = new Map<string, number>();
  const ids = ((kind: string) => {
    const n = (counters.get(kind) ?? 0) + 1;
    counters.set(kind, n);
    return `${kind}_v${v}_${n}`;
  }) as IdSource;
  const now = new Date(v === 1 ? "2026-12-02T10:30:00.123Z" : "2027-01-15T08:00:00.456Z");
  return new Write(silent, ids, now, { actor: `idn_actor${v}`, requestId: v === 1 ? "req-1" : null, ...(action ? { action } : {}) });
}

const key = sealer(Buffer.alloc(32, 7).toString("base64"));
// Sealing draws a random IV: a fixed one here, so the sealed bytes compare.
const detSealer = { ...key, seal: (plain: string, ctx: string) => new Uint8Array(Buffer.from(`${ctx}|${plain}`)) };

const caller = (v: number) => ({ identityId: `idn_c${v}`, tenantId: `ten_t${v}` });
const raw = (v: number) => ({
  poolId: `pool_p${v}`,
  flavor: v === 1 ? "small" : "large-x",
  imageId: `img_${v}`,
  sshKeys: v === 1 ? [] : ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG4rT3vTt99Ox5kndS4HmgTrKBT8SKzhK4rhGkEVGlCI a@b"],
  ...(v === 1 ? {} : { userData: "#cloud-config\nruncmd: ['echo']", projectId: `prj_${v}` }),
  desiredState: (v === 1 ? "running" : "stopped") as "running" | "stopped",
  idempotencyKey: `key-${v}`,
});
const catalog = (v: number): Catalog => ({
  pool: {
    id: `pool_p${v}`,
    name: `p${v}`,
    class: "vps-host",
    agent: "bcd",
    runtime: "fake",
    providerAccountId: null,
    singleTenant: v === 2,
    createdAt: "2026-01-01T00:00:00.000Z",
  },
  flavor: { name: v === 1 ? "small" : "large-x", vcpus: v, memoryMib: 512 * v, diskGib: 10 * v, gpus: [] },
  projectOk: true,
  image: { url: `https://img/${v}`, sha256: v === 1 ? (null as unknown as string) : "ab".repeat(32), format: "qcow2", verified: v === 2 },
});
const deps = (): AdmissionDeps => ({ images: tableImages, runtimes: ["fake"], maxRecreateAttempts: 3, sealer: detSealer, newIdempotencyKey: () => "k" });

async function admission(v: number, remembered: boolean, opts: AdmitOptions, action = "createInstance"): Promise<{ w: Write; a: Admission }> {
  const w = writeOf(v, action);
  const create = createOf(deps(), caller(v), raw(v));
  return { w, a: await planAdmission(w, deps(), create, { catalog: catalog(v), remembered }, opts) };
}

const inst = (v: number, over: Partial<Instance> = {}) =>
  ({ id: `ins_${v}`, tenantId: `ten_t${v}`, state: "scheduling", desiredState: "running", nodeId: null, ...over }) as Instance;
const tenant = (v: number) => ({ identityId: `idn_c${v}`, tenantId: `ten_t${v}`, operator: false, scopes: new Set() }) as unknown as Principal;

/** Each scenario's statements, as the code sends them (the order of the fixture's). */
const scenarios: Record<string, (v: number) => Promise<Fragment[]>> = {
  "admission.remembered": async (v) => {
    const { w, a } = await admission(v, true, { commits: true });
    return [admissionStatement(w, a, true)];
  },
  "admission.lookedUp": async (v) => {
    const { w, a } = await admission(v, false, { commits: true });
    return [lookupStatement(a.create), admissionStatement(w, a, true)];
  },
  // Placed step by step: what the lease and the claim returned, as the fixture's run had them return it.
  "admission.stepByStep": async (v) => {
    const { w, a } = await admission(v, true, {});
    const placed = { ...a.placed, nodeId: `node_${v}`, allocationId: `alloc_v${v}_1`, addresses: [`10.0.0.${v}`], deferred: undefined };
    placed.converged = { steps: placed.converged?.steps ?? [], specGeneration: 7 * v };
    return [admissionStatement(w, { ...a, placed }, false)];
  },
  "admission.warm": async (v) => {
    const sandbox = { warmTemplate: { id: `tpl_${v}`, version: v }, env: { A: `x${v}` }, networkPolicy: v === 1 ? null : ({ egress: "none" } as never) };
    const { w, a } = await admission(v, true, { charge: false, audit: false, desiredState: "paused", sandbox }, "createSandbox");
    return [admissionStatement(w, a, false)];
  },
  "change.place": async (v) => {
    const set = { state: "provisioning", node_id: `node_${v}`, allocation_id: `alloc_${v}`, addresses: [`10.0.0.${v}`] };
    return [changeStatement(writeOf(v), inst(v), set, `placed:${v}`).statement];
  },
  "change.quiet": async (v) => {
    const set = { state: "starting", conditions: [{ type: "x", status: `${v}` }] };
    return [changeStatement(writeOf(v), inst(v, { state: "provisioning", nodeId: `node_${v}` }), set, "host:starting").statement];
  },
  "change.lastWithCommand": async (v) => {
    const w = writeOf(v, "pauseInstance");
    await queuePowerWithChange(w, { id: `ins_${v}`, nodeId: `node_${v}` }, "instance.pause");
    w.audit({ targetId: `ins_${v}`, tenantId: `ten_t${v}`, details: { desired: "paused", n: v } });
    return [changeStatement(w, inst(v, { state: "running", nodeId: `node_${v}` }), { desired_state: "paused" }, "requested:paused", { last: true }).statement];
  },
  "power.requestPause": async (v) => [powerRequestChange(writeOf(v, "pauseInstance"), tenant(v), `ins_${v}`, "paused").change.statement],
  "power.requestResume": async (v) => [powerRequestChange(writeOf(v, "startInstance"), tenant(v), `ins_${v}`, "running").change.statement],
  "power.report": async (v) => {
    const report = {
      id: `cmd_${v}`,
      state: "succeeded" as const,
      result: v === 1 ? null : { ok: true },
      error: null,
      power: { kind: v === 1 ? ("instance.pause" as const) : ("instance.resume" as const), instanceId: `ins_${v}` },
    };
    return [powerReportChange(writeOf(v, "reportCommand"), `node_${v}`, report).statement];
  },
  "audit.row": async (v) => {
    const w = writeOf(v, "renameThing");
    w.audit({ targetId: `thing_${v}`, tenantId: v === 1 ? null : `ten_t${v}`, details: v === 1 ? undefined : { name: `it's "${v}"` } });
    return [closingStatement(w) as Fragment];
  },
  "audit.rowWithDeferred": async (v) => {
    const w = writeOf(v, "execInstance");
    const c = { nodeId: `node_${v}`, instanceId: `ins_${v}`, kind: "instance.exec" as const, args: { a: v }, timeoutMs: 1000 * v };
    await enqueueCommand(w, c, { deferred: true });
    w.audit({ targetId: `ins_${v}`, tenantId: `ten_t${v}` });
    return [closingStatement(w) as Fragment];
  },
};

/** Params as the fixture keeps them (JSON, with dates, bytes and big integers tagged). */
const stored = (v: unknown): unknown =>
  v instanceof Date
    ? { $date: v.toISOString() }
    : v instanceof Uint8Array
      ? { $bytes: Buffer.from(v).toString("hex") }
      : typeof v === "bigint"
        ? { $bigint: String(v) }
        : Array.isArray(v)
          ? v.map(stored)
          : v === undefined
            ? null
            : v;

/** The statement with each placeholder replaced by its value: equal for two texts that differ only in numbering. */
const inlined = (s: { text: string; params: unknown[] }) => s.text.replace(/\$(\d+)/g, (_, n: string) => `«${JSON.stringify(s.params[Number(n) - 1])}»`);

describe("statements built as SQL values", () => {
  for (const [name, build] of Object.entries(scenarios)) {
    it(`${name}: one text for both inputs, and the SQL it was`, async () => {
      const built = await Promise.all([1, 2].map(async (v) => (await build(v)).map((f) => ({ text: f.text, params: f.params.map(stored) }))));
      const [one, two] = built as [{ text: string; params: unknown[] }[], { text: string; params: unknown[] }[]];
      expect(one.map((s) => s.text)).toEqual(two.map((s) => s.text));
      for (const [k, now] of built.entries()) {
        const then = before[`${name}#${k + 1}`] as { text: string; params: unknown[] }[];
        expect(now).toHaveLength(then.length);
        for (const [i, st] of now.entries()) {
          const was = then[i] as { text: string; params: unknown[] };
          if (IDENTICAL.has(name)) expect(st).toEqual(was);
          else expect(inlined(st)).toBe(inlined(was));
          // The placeholders run from $1 without a gap, each bound.
          const used = new Set([...st.text.matchAll(/\$(\d+)/g)].map((m) => Number(m[1])));
          expect([...used].sort((a, b) => a - b)).toEqual(st.params.map((_, n) => n + 1));
        }
      }
    });
  }
});
