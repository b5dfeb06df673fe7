import { builder } from "./builder.ts";

const Viewer = builder.objectRef<{ identityId: string; tenantId: string | null; operator: boolean; scopes: string[] }>("Viewer").implement({
  description: "Who the bearer token speaks for.",
  fields: (t) => ({
    identityId: t.exposeID("identityId"),
    tenantId: t.exposeID("tenantId", { nullable: true }),
    isOperator: t.exposeBoolean("operator"),
    scopes: t.exposeStringList("scopes"),
  }),
});

builder.queryField("viewer", (t) =>
  t.withAuth({ authenticated: true }).field({
    type: Viewer,
    resolve: (_root, _args, { principal: p }) => ({ identityId: p.identityId, tenantId: p.tenantId, operator: p.operator, scopes: [...p.scopes].sort() }),
  }),
);
