import { invalid, notFound } from "../../contracts/errors.ts";
import { type ApiToken as ApiTokenRow, createApiToken, revokeApiToken } from "../../core/auth/tokens.ts";
import { deleteTenant } from "../../core/teardown/teardown.ts";
import { createProject, listProjects, type Project as ProjectRow } from "../../core/tenancy/projects.ts";
import { type QuotaItem as QuotaItemRow, quotaOf } from "../../core/tenancy/quota.ts";
import { createTenant, getTenant, listTenants, setTenantQuota, type Tenant as TenantRow } from "../../core/tenancy/tenants.ts";
import { mutate } from "../context.ts";
import { builder, GpuCountInput } from "./builder.ts";

const QuotaItem = builder.objectRef<QuotaItemRow>("QuotaItem").implement({
  description: "One quota resource: `instances`, `vcpus`, `memory_mib`, `disk_gib` or `gpu:<model>`; a null limit is unlimited.",
  fields: (t) => ({
    resource: t.exposeString("resource"),
    limit: t.exposeFloat("limit", { nullable: true }),
    used: t.exposeFloat("used"),
  }),
});

export const Tenant = builder.objectRef<TenantRow>("Tenant").implement({
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    deletedAt: t.expose("deletedAt", { type: "DateTime", nullable: true, description: "Set while the tenant is being deleted." }),
    quota: t.field({ type: [QuotaItem], resolve: (tenant, _a, ctx) => ctx.platform.read((sql) => quotaOf(sql, tenant.id)) }),
  }),
});

const QuotaInput = builder.inputType("QuotaInput", {
  description: "Limits; an absent field is unlimited (sandboxWarm: the deployment's default).",
  fields: (t) => ({
    instances: t.int(),
    vcpus: t.int(),
    memoryMib: t.int(),
    diskGib: t.int(),
    sandboxWarm: t.int({ description: "Warm sandbox instances over all the tenant's templates." }),
    gpus: t.field({ type: [GpuCountInput] }),
  }),
});

const CreateTenantInput = builder.inputType("CreateTenantInput", {
  fields: (t) => ({ name: t.string({ required: true }), quota: t.field({ type: QuotaInput }) }),
});

builder.queryFields((t) => ({
  tenants: t.withAuth({ operator: true }).field({
    type: [Tenant],
    resolve: (_r, _a, ctx) => ctx.platform.read(listTenants),
  }),
  tenant: t.withAuth({ authenticated: true }).field({
    type: Tenant,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => {
      if (!ctx.principal.operator && ctx.principal.tenantId !== id) return null;
      return (await ctx.platform.read((sql) => getTenant(sql, String(id)))) ?? null;
    },
  }),
}));

builder.mutationFields((t) => ({
  createTenant: t.withAuth({ operator: true }).field({
    type: Tenant,
    args: { input: t.arg({ type: CreateTenantInput, required: true }) },
    resolve: (_r, { input }, ctx, info) => mutate(ctx, info, (w) => createTenant(w, input)),
  }),
  deleteTenant: t.withAuth({ operator: true }).field({
    type: Tenant,
    description:
      "Operators: delete a tenant. Its tokens stop at once (live connections close); everything it has is deleted in the background, then the tenant; its usage stays.",
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx, info) => mutate(ctx, info, (w) => deleteTenant(w, String(id))),
  }),
  setTenantQuota: t.withAuth({ operator: true }).field({
    type: Tenant,
    args: { tenantId: t.arg.id({ required: true }), quota: t.arg({ type: QuotaInput, required: true }) },
    resolve: (_r, { tenantId, quota }, ctx, info) => mutate(ctx, info, (w) => setTenantQuota(w, String(tenantId), quota)),
  }),
}));

const ApiToken = builder.objectRef<ApiTokenRow>("ApiToken").implement({
  description: "A credential's metadata; the token itself is shown only by createApiToken.",
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    identityId: t.exposeID("identityId"),
    scopes: t.exposeStringList("scopes"),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    expiresAt: t.expose("expiresAt", { type: "DateTime", nullable: true }),
    revokedAt: t.expose("revokedAt", { type: "DateTime", nullable: true }),
  }),
});

const CreatedApiToken = builder.objectRef<{ token: string; apiToken: ApiTokenRow }>("CreatedApiToken").implement({
  fields: (t) => ({
    token: t.exposeString("token", { description: "The bearer token. Shown once: only its hash is stored." }),
    apiToken: t.field({ type: ApiToken, resolve: (c) => c.apiToken }),
  }),
});

const CreateApiTokenInput = builder.inputType("CreateApiTokenInput", {
  fields: (t) => ({
    tenantId: t.id({ required: true }),
    name: t.string({ required: true }),
    scopes: t.stringList({ description: "Defaults to every tenant scope." }),
    expiresAt: t.field({ type: "DateTime" }),
  }),
});

builder.mutationFields((t) => ({
  createApiToken: t.withAuth({ operator: true }).field({
    type: CreatedApiToken,
    args: { input: t.arg({ type: CreateApiTokenInput, required: true }) },
    resolve: (_r, { input }, ctx, info) => mutate(ctx, info, (w) => createApiToken(w, { ...input, tenantId: String(input.tenantId) })),
  }),
  revokeApiToken: t.withAuth({ operator: true }).field({
    type: ApiToken,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx, info) => mutate(ctx, info, (w) => revokeApiToken(w, String(id))),
  }),
}));

export const Project = builder.objectRef<ProjectRow>("Project").implement({
  fields: (t) => ({
    id: t.exposeID("id"),
    tenantId: t.exposeID("tenantId"),
    name: t.exposeString("name"),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

builder.queryField("projects", (t) =>
  t.withAuth({ operator: true, tenantScope: "compute:projects:read" }).field({
    type: [Project],
    args: { tenantId: t.arg.id({ description: "Operators: whose projects." }) },
    resolve: (_r, { tenantId }, { principal: p, platform }) => {
      const tenant = p.operator ? (tenantId ? String(tenantId) : undefined) : ownTenant(p.tenantId as string, tenantId);
      return platform.read((sql) => listProjects(sql, tenant));
    },
  }),
);

/** A tenant may name its own tenant; naming another is asking for something it cannot see. */
function ownTenant(own: string, named: string | number | null | undefined): string {
  if (named !== null && named !== undefined && String(named) !== own) throw notFound("tenant", String(named));
  return own;
}

builder.mutationField("createProject", (t) =>
  t.withAuth({ operator: true, tenantScope: "compute:projects:write" }).field({
    type: Project,
    args: { name: t.arg.string({ required: true }), tenantId: t.arg.id({ description: "Operators: the tenant it belongs to." }) },
    resolve: (_r, { name, tenantId }, ctx, info) => {
      const p = ctx.principal;
      let owner: string;
      if (p.operator) {
        if (!tenantId) throw invalid("operators name the tenant the project belongs to (tenantId)", { path: "tenantId" });
        owner = String(tenantId);
      } else owner = ownTenant(p.tenantId as string, tenantId);
      return mutate(ctx, info, (w) => createProject(w, owner, { name }));
    },
  }),
);
