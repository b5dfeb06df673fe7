import { invalid } from "../../contracts/errors.ts";
import { requireRead, requireTenantScope, visibleTo } from "../../core/auth/principal.ts";
import { admitInstance } from "../../core/instances/admission.ts";
import { type InstanceRow, resizeInstance, setDesiredState } from "../../core/instances/changes.ts";
import { type DesiredState as Desired, desiredStates, instanceStates } from "../../core/instances/state.ts";
import type { Prisma } from "../../prisma/generated/client.ts";
import { type Context, writeCtx } from "../context.ts";
import { builder, GpuCount } from "./builder.ts";

const upperValues = <T extends string>(values: readonly T[]) =>
  Object.fromEntries(values.map((v) => [v.toUpperCase(), { value: v }])) as { [K in T as Uppercase<K>]: { value: K } };

export const InstanceState = builder.enumType("InstanceState", { values: upperValues(instanceStates) });
export const DesiredState = builder.enumType("DesiredState", { values: upperValues(desiredStates) });

const Condition = builder.objectRef<{ type: string; reason: string; message: string }>("Condition").implement({
  description: "Why an instance is not where it should be: Unschedulable, RuntimeError or ProviderError.",
  fields: (t) => ({ type: t.exposeString("type"), reason: t.exposeString("reason"), message: t.exposeString("message") }),
});

export const Instance = builder.objectRef<InstanceRow>("Instance").implement({
  fields: (t) => ({
    id: t.exposeID("id"),
    state: t.field({ type: InstanceState, resolve: (i) => i.state as "pending" }),
    desiredState: t.field({ type: DesiredState, resolve: (i) => i.desiredState as "running" }),
    flavor: t.exposeString("flavor"),
    vcpus: t.exposeInt("vcpus"),
    memoryMib: t.exposeInt("memoryMib"),
    diskGib: t.exposeInt("diskGib"),
    gpus: t.field({ type: [GpuCount], resolve: (i) => i.gpus as { model: string; count: number }[] }),
    imageId: t.exposeString("imageId"),
    imageVerified: t.exposeBoolean("imageVerified"),
    sshKeys: t.exposeStringList("sshKeys"),
    userData: t.string({
      nullable: true,
      description: "The user data in clear, for the identity that created the instance only; null for everyone else.",
      resolve: (i, _a, ctx) => (i.userDataSealed && ctx.principal?.identityId === i.ownerIdentityId ? ctx.platform.sealer.open(i.userDataSealed, i.id) : null),
    }),
    addresses: t.exposeStringList("addresses"),
    conditions: t.field({ type: [Condition], resolve: (i) => i.conditions as { type: string; reason: string; message: string }[] }),
    runtime: t.exposeString("runtime", { nullable: true }),
    nodeId: t.exposeID("nodeId", { nullable: true }),
    allocationId: t.exposeID("allocationId", { nullable: true }),
    externalId: t.exposeString("externalId", { nullable: true }),
    poolId: t.exposeID("poolId"),
    projectId: t.exposeID("projectId", { nullable: true }),
    tenantId: t.exposeID("tenantId"),
    ownerIdentityId: t.exposeID("ownerIdentityId"),
    idempotencyKey: t.exposeString("idempotencyKey"),
    version: t.exposeInt("version"),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    updatedAt: t.expose("updatedAt", { type: "DateTime" }),
  }),
});

const PageInfo = builder.objectRef<{ hasNextPage: boolean; endCursor: string | null }>("PageInfo").implement({
  fields: (t) => ({ hasNextPage: t.exposeBoolean("hasNextPage"), endCursor: t.exposeString("endCursor", { nullable: true }) }),
});
const InstanceEdge = builder.objectRef<{ cursor: string; node: InstanceRow }>("InstanceEdge").implement({
  fields: (t) => ({ cursor: t.exposeString("cursor"), node: t.field({ type: Instance, resolve: (e) => e.node }) }),
});
const InstanceConnection = builder
  .objectRef<{ edges: { cursor: string; node: InstanceRow }[]; pageInfo: { hasNextPage: boolean; endCursor: string | null } }>("InstanceConnection")
  .implement({
    fields: (t) => ({
      edges: t.field({ type: [InstanceEdge], resolve: (c) => c.edges }),
      nodes: t.field({ type: [Instance], resolve: (c) => c.edges.map((e) => e.node) }),
      pageInfo: t.field({ type: PageInfo, resolve: (c) => c.pageInfo }),
    }),
  });

const InstanceOwner = builder.enumType("InstanceOwner", {
  description: "Whose instances a list shows.",
  values: {
    MINE: { value: "mine", description: "Created by the caller's identity (the default for tenants)." },
    TENANT: { value: "tenant", description: "Every instance of the caller's tenant." },
    ALL: { value: "all", description: "Operators: every tenant's (their default)." },
  } as const,
});

// Newest first; the cursor is the (createdAt, id) of the last row, so pages are stable under inserts.
const encodeCursor = (i: InstanceRow) => Buffer.from(JSON.stringify([i.createdAt.toISOString(), i.id])).toString("base64url");
function decodeCursor(c: string): { at: Date; id: string } {
  try {
    const [at, id] = JSON.parse(Buffer.from(c, "base64url").toString()) as [string, string];
    const d = new Date(at);
    if (typeof id !== "string" || Number.isNaN(d.getTime())) throw new Error();
    return { at: d, id };
  } catch {
    throw invalid("after is not a cursor from this list", { path: "after" });
  }
}

builder.queryFields((t) => ({
  instance: t.field({
    type: Instance,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => {
      const p = requireRead(ctx.principal, "compute:instances:read");
      const inst = await ctx.platform.db.prisma.instance.findUnique({ where: { id: String(id) } });
      return inst && visibleTo(p, inst.tenantId) ? inst : null;
    },
  }),
  instances: t.field({
    type: InstanceConnection,
    args: {
      poolId: t.arg.id(),
      projectId: t.arg.id(),
      state: t.arg({ type: InstanceState }),
      owner: t.arg({ type: InstanceOwner }),
      first: t.arg.int({ description: "Page size, 1 to 500 (default 50)." }),
      after: t.arg.string(),
    },
    resolve: async (_r, args, ctx) => {
      const p = requireRead(ctx.principal, "compute:instances:read");
      const first = args.first ?? 50;
      if (first < 1 || first > 500) throw invalid("first must be 1 to 500", { path: "first" });
      const owner = args.owner ?? (p.operator ? "all" : "mine");
      if (owner === "all" && !p.operator) throw invalid("owner ALL is for operators", { path: "owner" });
      const where: Prisma.InstanceWhereInput = {
        ...(p.operator ? {} : { tenantId: p.tenantId as string }),
        ...(owner === "mine" ? { ownerIdentityId: p.identityId } : {}),
        ...(args.poolId ? { poolId: String(args.poolId) } : {}),
        ...(args.projectId ? { projectId: String(args.projectId) } : {}),
        ...(args.state ? { state: args.state } : {}),
      };
      if (args.after) {
        const c = decodeCursor(args.after);
        where.OR = [{ createdAt: { lt: c.at } }, { createdAt: c.at, id: { lt: c.id } }];
      }
      const rows = await ctx.platform.db.prisma.instance.findMany({ where, orderBy: [{ createdAt: "desc" }, { id: "desc" }], take: first + 1 });
      const page = rows.slice(0, first);
      const edges = page.map((node) => ({ cursor: encodeCursor(node), node }));
      return { edges, pageInfo: { hasNextPage: rows.length > first, endCursor: edges.at(-1)?.cursor ?? null } };
    },
  }),
}));

const CreateInstanceInput = builder.inputType("CreateInstanceInput", {
  fields: (t) => ({
    poolId: t.id({ required: true }),
    flavor: t.string({ required: true, description: "A flavor name of the pool." }),
    imageId: t.string({ required: true, description: "Hosted pools: an image id the tenant can see; provider pools: the provider's image name." }),
    sshKeys: t.stringList({ description: "OpenSSH public keys." }),
    userData: t.string({ description: "Cloud-init user data, at most 64 KiB; sealed at rest." }),
    projectId: t.id(),
    desiredState: t.field({ type: DesiredState, description: "RUNNING (default) or STOPPED." }),
    idempotencyKey: t.string({ description: "Replaying a create with the same key returns the same instance." }),
  }),
});

async function changeDesired(ctx: Context, id: string, desired: Desired, scope: "compute:instances:update" | "compute:instances:delete") {
  const p = ctx.principal?.operator ? ctx.principal : requireTenantScope(ctx.principal, scope);
  return ctx.platform.write(async (sql, emit) => {
    const change = await setDesiredState(sql, p, id, desired, writeCtx(ctx));
    emit(change);
    return change.instance;
  });
}

builder.mutationFields((t) => ({
  createInstance: t.field({
    type: Instance,
    args: { input: t.arg({ type: CreateInstanceInput, required: true }) },
    resolve: (_r, { input }, ctx) => {
      const p = requireTenantScope(ctx.principal, "compute:instances:create");
      const { platform } = ctx;
      const deps = {
        ids: platform.ids,
        images: platform.images,
        sealer: platform.sealer,
        runtimes: platform.config.vps.runtimes,
        now: platform.now,
        newIdempotencyKey: () => crypto.randomUUID(),
      };
      return platform.write(async (sql, emit) => {
        const admitted = await admitInstance(
          sql,
          deps,
          { identityId: p.identityId, tenantId: p.tenantId, requestId: ctx.requestId },
          {
            ...input,
            poolId: String(input.poolId),
            projectId: input.projectId ? String(input.projectId) : undefined,
            sshKeys: input.sshKeys ?? undefined,
            userData: input.userData ?? undefined,
            desiredState: (input.desiredState ?? undefined) as "running" | undefined,
            idempotencyKey: input.idempotencyKey ?? undefined,
          },
        );
        emit(admitted);
        return admitted.instance;
      });
    },
  }),
  startInstance: t.field({
    type: Instance,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => changeDesired(ctx, String(id), "running", "compute:instances:update"),
  }),
  stopInstance: t.field({
    type: Instance,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => changeDesired(ctx, String(id), "stopped", "compute:instances:update"),
  }),
  pauseInstance: t.field({
    type: Instance,
    description: "Freeze a running instance in memory (its host keeps it; start resumes it). Hosted pools.",
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => changeDesired(ctx, String(id), "paused", "compute:instances:update"),
  }),
  deleteInstance: t.field({
    type: Instance,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => changeDesired(ctx, String(id), "deleted", "compute:instances:delete"),
  }),
  resizeInstance: t.field({
    type: Instance,
    args: { id: t.arg.id({ required: true }), flavor: t.arg.string({ required: true }) },
    resolve: (_r, { id, flavor }, ctx) => {
      const p = ctx.principal?.operator ? ctx.principal : requireTenantScope(ctx.principal, "compute:instances:update");
      return ctx.platform.write(async (sql, emit) => {
        const change = await resizeInstance(sql, ctx.platform.ids, p, String(id), flavor, writeCtx(ctx));
        emit(change);
        return change.instance;
      });
    },
  }),
}));
