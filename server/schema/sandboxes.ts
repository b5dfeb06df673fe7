import {
  createSandbox,
  deleteSandbox,
  extendSandbox,
  getSandbox,
  listSandboxes,
  type Sandbox as SandboxRow,
  sandboxInstance,
  sandboxState,
} from "../../core/sandboxes/sandboxes.ts";
import { warmStats } from "../../core/sandboxes/stats.ts";
import {
  createTemplate,
  deleteTemplate,
  getTemplate,
  listTemplates,
  type SandboxTemplate as TemplateRow,
  updateTemplate,
} from "../../core/sandboxes/templates.ts";
import { type Context, mutate } from "../context.ts";
import { builder } from "./builder.ts";
import { Instance } from "./instances.ts";

/** Sandbox templates and sandboxes: tenants' short-lived VMs on hosted pools, with deadlines and warm pools. */

const Egress = builder.enumType("Egress", {
  values: {
    NONE: { value: "none", description: "Nothing out (DHCP and ARP still pass)." },
    ALLOWLIST: { value: "allowlist", description: "Only the listed destinations." },
    ALL: { value: "all" },
  } as const,
});

export const SandboxState = builder.enumType("SandboxState", {
  values: { CREATING: {}, RUNNING: {}, DELETING: {}, DELETED: {}, ERROR: { description: "Its instance failed, stopped or was lost." } } as const,
});

const EnvVar = builder.objectRef<{ name: string; value: string }>("EnvVar").implement({
  fields: (t) => ({ name: t.exposeString("name"), value: t.exposeString("value") }),
});
const EnvVarInput = builder.inputType("EnvVarInput", {
  fields: (t) => ({ name: t.string({ required: true }), value: t.string({ required: true }) }),
});

type NetworkRow = TemplateRow["network"];
const NetworkPolicy = builder.objectRef<NetworkRow>("NetworkPolicy").implement({
  fields: (t) => ({
    egress: t.field({ type: Egress, resolve: (n) => n.egress }),
    allow: t.stringList({
      description: 'ALLOWLIST destinations, "CIDR:PORT/PROTO" (PORT * for every port).',
      resolve: (n) => n.allow.map((r) => `${r.cidr}:${r.port ?? "*"}/${r.proto}`),
    }),
  }),
});
const NetworkPolicyInput = builder.inputType("NetworkPolicyInput", {
  fields: (t) => ({ egress: t.field({ type: Egress, required: true }), allow: t.stringList({ description: '"CIDR:PORT/PROTO", e.g. "10.0.0.0/8:443/tcp".' }) }),
});

type WarmRow = Awaited<ReturnType<typeof warmStats>>;
const WarmPool = builder.objectRef<WarmRow>("WarmPool").implement({
  description: "A template's warm pool: instances booted and paused for instant starts, and how claims fared.",
  fields: (t) => ({
    target: t.exposeInt("target"),
    ready: t.exposeInt("ready", { description: "Paused and claimable now." }),
    warming: t.exposeInt("warming", { description: "Booting toward paused." }),
    claims: t.exposeInt("claims", { description: "Sandboxes created from the template." }),
    hits: t.exposeInt("hits", { description: "Of those, served from the warm pool." }),
    hitRate: t.exposeFloat("hitRate", { nullable: true }),
    claimP50Ms: t.exposeFloat("claimP50Ms", { nullable: true, description: "Warm claims: create → running, median of the latest 100." }),
  }),
});

const SandboxTemplate = builder.objectRef<TemplateRow>("SandboxTemplate").implement({
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    version: t.exposeInt("version"),
    tenantId: t.exposeID("tenantId"),
    poolId: t.exposeID("poolId"),
    flavor: t.exposeString("flavor"),
    imageId: t.exposeString("imageId"),
    env: t.field({ type: [EnvVar], resolve: (x) => x.env }),
    network: t.field({ type: NetworkPolicy, resolve: (x) => x.network }),
    ttlSeconds: t.exposeInt("ttlSeconds"),
    maxTtlSeconds: t.exposeInt("maxTtlSeconds"),
    warm: t.field({ type: WarmPool, resolve: (x, _a, ctx) => ctx.platform.read((sql) => warmStats(sql, x)) }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    updatedAt: t.expose("updatedAt", { type: "DateTime" }),
  }),
});

const instanceOf = (s: SandboxRow, ctx: Context) => ctx.platform.read((sql) => sandboxInstance(sql, s));

export const Sandbox = builder.objectRef<SandboxRow>("Sandbox").implement({
  fields: (t) => ({
    id: t.exposeID("id"),
    state: t.field({ type: SandboxState, resolve: async (s, _a, ctx) => sandboxState((await instanceOf(s, ctx))?.state ?? "deleted") }),
    templateId: t.exposeID("templateId", { nullable: true }),
    templateVersion: t.exposeInt("templateVersion", { nullable: true }),
    fromSnapshotId: t.exposeID("fromSnapshotId", { nullable: true }),
    instance: t.field({ type: Instance, resolve: (s, _a, ctx) => instanceOf(s, ctx) }),
    warm: t.exposeBoolean("warm", { description: "Served from the template's warm pool." }),
    expiresAt: t.expose("expiresAt", { type: "DateTime" }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

const CreateSandboxTemplateInput = builder.inputType("CreateSandboxTemplateInput", {
  fields: (t) => ({
    name: t.string({ required: true }),
    poolId: t.id({ required: true, description: "A hosted pool." }),
    flavor: t.string({ required: true }),
    imageId: t.string({ required: true }),
    env: t.field({ type: [EnvVarInput], description: "Exported in the guest (through its seed) and given to exec." }),
    network: t.field({ type: NetworkPolicyInput, description: "Default: ALL." }),
    ttlSeconds: t.int({ required: true, description: "A sandbox's lifetime unless its create says otherwise." }),
    maxTtlSeconds: t.int({ description: "The longest a sandbox may live, extensions included (default: 1 h, or ttlSeconds if longer)." }),
    warm: t.int({ description: "Warm pool target: instances kept booted and paused (charged to the tenant's sandbox_warm quota)." }),
  }),
});
const UpdateSandboxTemplateInput = builder.inputType("UpdateSandboxTemplateInput", {
  fields: (t) => ({
    poolId: t.id(),
    flavor: t.string(),
    imageId: t.string(),
    env: t.field({ type: [EnvVarInput] }),
    network: t.field({ type: NetworkPolicyInput }),
    ttlSeconds: t.int(),
    maxTtlSeconds: t.int(),
    warm: t.int(),
  }),
});
const CreateSandboxInput = builder.inputType("CreateSandboxInput", {
  fields: (t) => ({
    templateId: t.id(),
    snapshotId: t.id({ description: "Restore from a sandbox snapshot instead of a template." }),
    ttlSeconds: t.int({ description: "Default: the template's ttlSeconds; at most its maxTtlSeconds." }),
    idempotencyKey: t.string({ description: "Replaying a create with the same key returns the same sandbox." }),
  }),
});

const templateDeps = (ctx: Context) => ({ images: ctx.platform.images, defaultWarmQuota: ctx.platform.config.sandboxes.defaultWarmQuota });
const asInput = <T>(x: T) => JSON.parse(JSON.stringify(x)) as T;

const readsSandboxes = { operator: true, tenantScope: "compute:sandboxes:read" } as const;
const writesSandboxes = { tenantScope: "compute:sandboxes:write" } as const;

builder.queryFields((t) => ({
  sandboxTemplates: t.withAuth(readsSandboxes).field({
    type: [SandboxTemplate],
    resolve: (_r, _a, ctx) => ctx.platform.read((sql) => listTemplates(sql, ctx.principal)),
  }),
  sandboxTemplate: t.withAuth(readsSandboxes).field({
    type: SandboxTemplate,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => ctx.platform.read((sql) => getTemplate(sql, ctx.principal, String(id))),
  }),
  sandbox: t.withAuth(readsSandboxes).field({
    type: Sandbox,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => ctx.platform.read((sql) => getSandbox(sql, ctx.principal, String(id))),
  }),
  sandboxes: t.withAuth(readsSandboxes).field({
    type: [Sandbox],
    description: "Newest first; `after` is the id of the last sandbox of the previous page.",
    args: { templateId: t.arg.id(), first: t.arg.int({ defaultValue: 50 }), after: t.arg.id() },
    complexity: (args) => ({ field: 1, multiplier: Math.max(1, Math.min(args.first ?? 50, 500)) }),
    resolve: (_r, a, ctx) => {
      const first = Math.max(1, Math.min(a.first ?? 50, 500));
      return ctx.platform.read((sql) =>
        listSandboxes(sql, ctx.principal, { templateId: a.templateId ? String(a.templateId) : null, first, after: a.after ? String(a.after) : null }),
      );
    },
  }),
}));

builder.mutationFields((t) => ({
  createSandboxTemplate: t.withAuth(writesSandboxes).field({
    type: SandboxTemplate,
    args: { input: t.arg({ type: CreateSandboxTemplateInput, required: true }) },
    resolve: (_r, { input }, ctx, info) => mutate(ctx, info, (w) => createTemplate(w, templateDeps(ctx), ctx.principal, asInput(input))),
  }),
  updateSandboxTemplate: t.withAuth(writesSandboxes).field({
    type: SandboxTemplate,
    description: "Any change makes a new version: warm instances of older versions are drained and replaced.",
    args: { id: t.arg.id({ required: true }), input: t.arg({ type: UpdateSandboxTemplateInput, required: true }) },
    resolve: (_r, { id, input }, ctx, info) => mutate(ctx, info, (w) => updateTemplate(w, templateDeps(ctx), ctx.principal, String(id), asInput(input))),
  }),
  deleteSandboxTemplate: t.withAuth(writesSandboxes).field({
    type: SandboxTemplate,
    description: "Its warm pool is drained; sandboxes made from it run on to their deadline.",
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx, info) => mutate(ctx, info, (w) => deleteTemplate(w, ctx.principal, String(id), ctx.platform.config.sandboxes.defaultWarmQuota)),
  }),
  createSandbox: t.withAuth(writesSandboxes).field({
    type: Sandbox,
    args: { input: t.arg({ type: CreateSandboxInput, required: true }) },
    resolve: (_r, { input }, ctx, info) => mutate(ctx, info, (w) => createSandbox(w, ctx.platform.admission, ctx.principal, asInput(input))),
  }),
  deleteSandbox: t.withAuth(writesSandboxes).field({
    type: Sandbox,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx, info) => mutate(ctx, info, (w) => deleteSandbox(w, ctx.principal, String(id))),
  }),
  extendSandbox: t.withAuth(writesSandboxes).field({
    type: Sandbox,
    description: "A new deadline ttlSeconds from now, within the template's maxTtlSeconds counted from creation.",
    args: { id: t.arg.id({ required: true }), ttlSeconds: t.arg.int({ required: true }) },
    resolve: (_r, { id, ttlSeconds }, ctx, info) => mutate(ctx, info, (w) => extendSandbox(w, ctx.principal, String(id), ttlSeconds)),
  }),
}));
