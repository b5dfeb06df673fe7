import type { GraphQLResolveInfo } from "graphql";
import { requireTenantScope } from "../../core/auth/principal.ts";
import { admitInstance } from "../../core/instances/admission.ts";
import { resizeInstance, setDesiredState } from "../../core/instances/lifecycle.ts";
import type { Condition as ConditionRow, Instance as InstanceRow } from "../../core/instances/model.ts";
import { getInstance, type InstancePage, listInstances } from "../../core/instances/queries.ts";
import { type DesiredState as Desired, desiredStates, instanceStates } from "../../core/instances/state.ts";
import { type Context, mutate } from "../context.ts";
import { builder, GpuCount } from "./builder.ts";

const upperValues = <T extends string>(values: readonly T[]) =>
  Object.fromEntries(values.map((v) => [v.toUpperCase(), { value: v }])) as { [K in T as Uppercase<K>]: { value: K } };

export const InstanceState = builder.enumType("InstanceState", { values: upperValues(instanceStates) });
export const DesiredState = builder.enumType("DesiredState", { values: upperValues(desiredStates) });

const Condition = builder.objectRef<ConditionRow>("Condition").implement({
  description: "Why an instance is not where it should be: Unschedulable, RuntimeError (reason HostReported, GuestCrashed or RuntimeMissing) or ProviderError.",
  fields: (t) => ({ type: t.exposeString("type"), reason: t.exposeString("reason"), message: t.exposeString("message") }),
});

export const Instance = builder.objectRef<InstanceRow>("Instance").implement({
  fields: (t) => ({
    id: t.exposeID("id"),
    state: t.field({ type: InstanceState, resolve: (i) => i.state }),
    desiredState: t.field({ type: DesiredState, resolve: (i) => i.desiredState }),
    flavor: t.exposeString("flavor"),
    vcpus: t.exposeInt("vcpus"),
    memoryMib: t.exposeInt("memoryMib"),
    diskGib: t.exposeInt("diskGib"),
    gpus: t.field({ type: [GpuCount], resolve: (i) => i.gpus }),
    imageId: t.exposeString("imageId"),
    imageVerified: t.exposeBoolean("imageVerified"),
    sshKeys: t.exposeStringList("sshKeys"),
    userData: t.string({
      nullable: true,
      description: "The user data in clear, for the identity that created the instance only; null for everyone else.",
      resolve: (i, _a, ctx) => (i.userDataSealed && ctx.principal?.identityId === i.ownerIdentityId ? ctx.platform.sealer.open(i.userDataSealed, i.id) : null),
    }),
    addresses: t.exposeStringList("addresses", {
      description: "Hosted pools: the address leased from the pool's range, then those its host's runtime reports it using.",
    }),
    conditions: t.field({ type: [Condition], resolve: (i) => i.conditions }),
    runtime: t.exposeString("runtime", { nullable: true }),
    nodeId: t.exposeID("nodeId", { nullable: true }),
    allocationId: t.exposeID("allocationId", { nullable: true }),
    externalId: t.exposeString("externalId", { nullable: true }),
    offer: t.exposeString("offer", { nullable: true, description: "Provider pools: the provider's machine type the flavor mapped to." }),
    sandboxId: t.exposeID("sandboxId", { nullable: true, description: "The sandbox this instance runs: the sandboxes API drives it." }),
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

const PageInfo = builder.objectRef<InstancePage["pageInfo"]>("PageInfo").implement({
  fields: (t) => ({ hasNextPage: t.exposeBoolean("hasNextPage"), endCursor: t.exposeString("endCursor", { nullable: true }) }),
});
const InstanceEdge = builder.objectRef<InstancePage["edges"][number]>("InstanceEdge").implement({
  fields: (t) => ({ cursor: t.exposeString("cursor"), node: t.field({ type: Instance, resolve: (e) => e.node }) }),
});
const InstanceConnection = builder.objectRef<InstancePage>("InstanceConnection").implement({
  fields: (t) => ({
    // A page's size is counted once, by `instances(first:)`.
    edges: t.field({ type: [InstanceEdge], complexity: { multiplier: 1 }, resolve: (c) => c.edges }),
    nodes: t.field({ type: [Instance], complexity: { multiplier: 1 }, resolve: (c) => c.edges.map((e) => e.node) }),
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

builder.queryFields((t) => ({
  instance: t.field({
    type: Instance,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => ctx.platform.read((sql) => getInstance(sql, ctx.principal, String(id))),
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
    complexity: (args) => ({ multiplier: args.first ?? 50 }),
    resolve: (_r, args, ctx) =>
      ctx.platform.read((sql) =>
        listInstances(sql, ctx.principal, {
          ...args,
          poolId: args.poolId ? String(args.poolId) : null,
          projectId: args.projectId ? String(args.projectId) : null,
        }),
      ),
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

/** Operators act on any instance; tenants need the scope. */
const actor = (ctx: Context, scope: "compute:instances:update" | "compute:instances:delete") =>
  ctx.principal?.operator ? ctx.principal : requireTenantScope(ctx.principal, scope);

const changeDesired =
  (desired: Desired, scope: "compute:instances:update" | "compute:instances:delete") =>
  (_r: unknown, { id }: { id: string | number }, ctx: Context, info: GraphQLResolveInfo) => {
    const p = actor(ctx, scope);
    return mutate(ctx, info, (w) => setDesiredState(w, p, String(id), desired));
  };

builder.mutationFields((t) => ({
  createInstance: t.field({
    type: Instance,
    args: { input: t.arg({ type: CreateInstanceInput, required: true }) },
    resolve: (_r, { input }, ctx, info) => {
      const p = requireTenantScope(ctx.principal, "compute:instances:create");
      return mutate(ctx, info, (w) =>
        admitInstance(
          w,
          ctx.platform.admission,
          { identityId: p.identityId, tenantId: p.tenantId },
          {
            ...input,
            poolId: String(input.poolId),
            projectId: input.projectId ? String(input.projectId) : undefined,
            sshKeys: input.sshKeys ?? undefined,
            userData: input.userData ?? undefined,
            desiredState: (input.desiredState ?? undefined) as "running" | undefined,
            idempotencyKey: input.idempotencyKey ?? undefined,
          },
          { commits: true },
        ),
      );
    },
  }),
  startInstance: t.field({ type: Instance, args: { id: t.arg.id({ required: true }) }, resolve: changeDesired("running", "compute:instances:update") }),
  stopInstance: t.field({ type: Instance, args: { id: t.arg.id({ required: true }) }, resolve: changeDesired("stopped", "compute:instances:update") }),
  pauseInstance: t.field({
    type: Instance,
    description: "Freeze a running instance in memory (its host keeps it; start resumes it). Hosted pools.",
    args: { id: t.arg.id({ required: true }) },
    resolve: changeDesired("paused", "compute:instances:update"),
  }),
  deleteInstance: t.field({ type: Instance, args: { id: t.arg.id({ required: true }) }, resolve: changeDesired("deleted", "compute:instances:delete") }),
  resizeInstance: t.field({
    type: Instance,
    args: { id: t.arg.id({ required: true }), flavor: t.arg.string({ required: true }) },
    resolve: (_r, { id, flavor }, ctx, info) => {
      const p = actor(ctx, "compute:instances:update");
      return mutate(ctx, info, (w) => resizeInstance(w, p, String(id), flavor));
    },
  }),
}));
