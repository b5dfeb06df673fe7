import { notFound } from "../../contracts/errors.ts";
import { requireAuth, requireOperator, requireRead, requireTenantScope } from "../../core/auth/principal.ts";
import { createApiToken, createProject, createTenant, quotaOf, revokeApiToken, setQuotaLimits } from "../../core/tenancy/tenants.ts";
import type { ApiToken as ApiTokenRow, Project as ProjectRow, Tenant as TenantRow } from "../../prisma/generated/client.ts";
import { writeCtx } from "../context.ts";
import { builder, GpuCountInput } from "./builder.ts";

const QuotaItem = builder.objectRef<{ resource: string; limit: bigint | null; used: bigint }>("QuotaItem").implement({
  description: "One quota resource: `instances`, `vcpus`, `memory_mib`, `disk_gib` or `gpu:<model>`; a null limit is unlimited.",
  fields: (t) => ({
    resource: t.exposeString("resource"),
    limit: t.float({ nullable: true, resolve: (q) => (q.limit === null ? null : Number(q.limit)) }),
    used: t.float({ resolve: (q) => Number(q.used) }),
  }),
});

export const Tenant = builder.objectRef<TenantRow>("Tenant").implement({
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    quota: t.field({ type: [QuotaItem], resolve: (tenant, _a, ctx) => quotaOf(ctx.platform.db.prisma, tenant.id) }),
  }),
});

const QuotaInput = builder.inputType("QuotaInput", {
  description: "Limits; an absent field is unlimited.",
  fields: (t) => ({
    instances: t.int(),
    vcpus: t.int(),
    memoryMib: t.int(),
    diskGib: t.int(),
    gpus: t.field({ type: [GpuCountInput] }),
  }),
});

const CreateTenantInput = builder.inputType("CreateTenantInput", {
  fields: (t) => ({ name: t.string({ required: true }), quota: t.field({ type: QuotaInput }) }),
});

builder.queryFields((t) => ({
  tenants: t.field({
    type: [Tenant],
    resolve: (_r, _a, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.db.prisma.tenant.findMany({ orderBy: { createdAt: "asc" } });
    },
  }),
  tenant: t.field({
    type: Tenant,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => {
      const p = requireAuth(ctx.principal);
      if (!p.operator && p.tenantId !== id) return null;
      return ctx.platform.db.prisma.tenant.findUnique({ where: { id: String(id) } });
    },
  }),
}));

builder.mutationFields((t) => ({
  createTenant: t.field({
    type: Tenant,
    args: { input: t.arg({ type: CreateTenantInput, required: true }) },
    resolve: (_r, { input }, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.transact((tx) => createTenant(tx, writeCtx(ctx), input));
    },
  }),
  setTenantQuota: t.field({
    type: Tenant,
    args: { tenantId: t.arg.id({ required: true }), quota: t.arg({ type: QuotaInput, required: true }) },
    resolve: (_r, { tenantId, quota }, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.transact(async (tx) => {
        const tenant = await tx.tenant.findUnique({ where: { id: String(tenantId) } });
        if (!tenant) throw notFound("tenant", String(tenantId));
        await setQuotaLimits(tx, tenant.id, quota);
        return tenant;
      });
    },
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
  createApiToken: t.field({
    type: CreatedApiToken,
    args: { input: t.arg({ type: CreateApiTokenInput, required: true }) },
    resolve: (_r, { input }, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.transact((tx) => createApiToken(tx, writeCtx(ctx), { ...input, tenantId: String(input.tenantId) }));
    },
  }),
  revokeApiToken: t.field({
    type: ApiToken,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.transact(async (tx, emit) => {
        const token = await revokeApiToken(tx, writeCtx(ctx), String(id));
        emit({ event: null, revoked: [`tok:${token.id}`] });
        return token;
      });
    },
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
  t.field({
    type: [Project],
    args: { tenantId: t.arg.id({ description: "Operators: whose projects." }) },
    resolve: (_r, { tenantId }, ctx) => {
      const p = requireRead(ctx.principal, "compute:projects:read");
      const tenant = p.operator ? (tenantId ? String(tenantId) : undefined) : (p.tenantId as string);
      return ctx.platform.db.prisma.project.findMany({ where: { tenantId: tenant }, orderBy: { createdAt: "asc" } });
    },
  }),
);

builder.mutationField("createProject", (t) =>
  t.field({
    type: Project,
    args: { name: t.arg.string({ required: true }), tenantId: t.arg.id({ description: "Operators: the tenant it belongs to." }) },
    resolve: (_r, { name, tenantId }, ctx) => {
      const p = requireAuth(ctx.principal);
      return ctx.platform.transact(async (tx) => {
        let owner: string;
        if (p.operator) {
          if (!tenantId || !(await tx.tenant.findUnique({ where: { id: String(tenantId) }, select: { id: true } })))
            throw notFound("tenant", String(tenantId ?? ""));
          owner = String(tenantId);
        } else {
          owner = requireTenantScope(p, "compute:projects:write").tenantId;
        }
        return createProject(tx, writeCtx(ctx), owner, { name });
      });
    },
  }),
);
