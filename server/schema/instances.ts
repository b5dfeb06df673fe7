import type { GraphQLResolveInfo } from "graphql";
import type { Condition as ConditionRow, Instance as InstanceRow } from "../../core/instances/model.ts";
import { getInstance, listInstances } from "../../core/instances/queries.ts";
import { type DesiredState as Desired, desiredStates, instanceStates } from "../../core/instances/state.ts";
import { admitInstance } from "../../core/lifecycle/admission.ts";
import { resizeInstance, setDesiredState } from "../../core/lifecycle/lifecycle.ts";
import { mutate } from "../context.ts";
import { type Admitted, builder, GpuCount } from "./builder.ts";
import { connection, pageArgs, pageCost } from "./connection.ts";

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

const InstanceConnection = connection("Instance", Instance);

const InstanceOwner = builder.enumType("InstanceOwner", {
  description: "Whose instances a list shows.",
  values: {
    MINE: { value: "mine", description: "Created by the caller's identity (the default for tenants)." },
    TENANT: { value: "tenant", description: "Every instance of the caller's tenant." },
    ALL: { value: "all", description: "Operators: every tenant's (their default)." },
  } as const,
});

builder.queryFields((t) => ({
  instance: t.withAuth({ operator: true, tenantScope: "compute:instances:read" }).field({
    type: Instance,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => ctx.platform.read((sql) => getInstance(sql, ctx.principal, String(id))),
  }),
  instances: t.withAuth({ operator: true, tenantScope: "compute:instances:read" }).field({
    type: InstanceConnection,
    args: {
      poolId: t.arg.id(),
      projectId: t.arg.id(),
      state: t.arg({ type: InstanceState }),
      owner: t.arg({ type: InstanceOwner }),
      ...pageArgs,
    },
    complexity: pageCost,
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
const updates = { operator: true, tenantScope: "compute:instances:update" } as const;
const deletes = { operator: true, tenantScope: "compute:instances:delete" } as const;

const changeDesired =
  (desired: Desired) =>
  (_r: unknown, { id }: { id: string | number }, ctx: Admitted, info: GraphQLResolveInfo) =>
    mutate(ctx, info, (w) => setDesiredState(w, ctx.principal, String(id), desired));

builder.mutationFields((t) => ({
  createInstance: t.withAuth({ tenantScope: "compute:instances:create" }).field({
    type: Instance,
    args: { input: t.arg({ type: CreateInstanceInput, required: true }) },
    resolve: (_r, { input }, ctx, info) => {
      const p = ctx.principal;
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
  startInstance: t.withAuth(updates).field({ type: Instance, args: { id: t.arg.id({ required: true }) }, resolve: changeDesired("running") }),
  stopInstance: t.withAuth(updates).field({ type: Instance, args: { id: t.arg.id({ required: true }) }, resolve: changeDesired("stopped") }),
  pauseInstance: t.withAuth(updates).field({
    type: Instance,
    description: "Freeze a running instance in memory (its host keeps it; start resumes it). Hosted pools.",
    args: { id: t.arg.id({ required: true }) },
    resolve: changeDesired("paused"),
  }),
  deleteInstance: t.withAuth(deletes).field({ type: Instance, args: { id: t.arg.id({ required: true }) }, resolve: changeDesired("deleted") }),
  resizeInstance: t.withAuth(updates).field({
    type: Instance,
    args: { id: t.arg.id({ required: true }), flavor: t.arg.string({ required: true }) },
    resolve: (_r, { id, flavor }, ctx, info) => mutate(ctx, info, (w) => resizeInstance(w, ctx.principal, String(id), flavor)),
  }),
}));
