import { type UsageRow as Row, usage } from "../../core/books/usage.ts";
import { builder } from "./builder.ts";

/** Metered usage (core/books/usage.ts): tenants read their own, operators anyone's; `/usage.csv` serves the same rows. */

export const UsageGroup = builder.enumType("UsageGroup", {
  values: {
    TENANT: { value: "tenant" },
    PROJECT: { value: "project" },
    INSTANCE: { value: "instance" },
    METER: { value: "meter" },
    HOUR: { value: "hour", description: "One row per UTC hour (its start in `start`): usage over time." },
    DAY: { value: "day", description: "One row per UTC day (its start in `start`)." },
  } as const,
});

const UsageRow = builder.objectRef<Row>("UsageRow").implement({
  description: "Usage of one meter, summed over the windows asked for and the groups chosen (ungrouped ids are null).",
  fields: (t) => ({
    start: t.field({
      type: "DateTime",
      nullable: true,
      description: "The hour or day the row sums, when grouped by HOUR or DAY.",
      resolve: (r) => r.start,
    }),
    meter: t.exposeString("meter", { description: "vps.vcpu.hours, vps.memory.gib.hours, gpu.<model>.hours or vps.sandbox.warm." }),
    tenantId: t.exposeID("tenantId", { nullable: true, description: "Null for warm pools (the operator's) or when not grouped by tenant." }),
    projectId: t.exposeID("projectId", { nullable: true }),
    instanceId: t.exposeID("instanceId", { nullable: true }),
    quantity: t.exposeFloat("quantity"),
    unit: t.exposeString("unit"),
  }),
});

builder.queryField("usage", (t) =>
  t.withAuth({ operator: true, tenantScope: "compute:usage:read" }).field({
    type: [UsageRow],
    description: "Metered usage of the 5-minute windows that start in [from, to), per meter and the groups asked for (default TENANT). Tenants see their own.",
    args: {
      from: t.arg({ type: "DateTime", required: true }),
      to: t.arg({ type: "DateTime", required: true }),
      tenantId: t.arg.id(),
      groupBy: t.arg({ type: [UsageGroup] }),
    },
    resolve: (_r, a, ctx) =>
      ctx.platform.read((sql) => usage(sql, ctx.principal, { from: a.from, to: a.to, tenantId: a.tenantId ? String(a.tenantId) : null, groupBy: a.groupBy })),
  }),
);
