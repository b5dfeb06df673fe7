import { accountingDrift, type Drift as DriftRow } from "../../core/books/accounting.ts";
import type { Finding as FindingRow } from "../../core/books/doctor.ts";
import { doctor } from "../../core/pools/doctor.ts";
import { builder } from "./builder.ts";
import { Pool } from "./pools.ts";

/** The books' health for operators: the doctor's findings and each pool's accounting (core/books/). */

const Severity = builder.enumType("FindingSeverity", {
  values: {
    INFO: { value: "info" },
    WARNING: { value: "warning", description: "Works now; will cost tenants or money if left." },
    ERROR: { value: "error", description: "Broken now, or the books disagree." },
  } as const,
});

const Finding = builder.objectRef<FindingRow>("Finding").implement({
  description: "Something an operator should fix: `id` says what kind of thing (vps.pools.ipam, vps.hosts.lost, …).",
  fields: (t) => ({
    id: t.exposeString("id"),
    severity: t.field({ type: Severity, resolve: (f) => f.severity }),
    subject: t.exposeString("subject", { description: "The pool, host, account, template, tenant/resource or row it is about." }),
    message: t.exposeString("message"),
    hint: t.exposeString("hint", { description: "How to fix it." }),
  }),
});

const Drift = builder.objectRef<DriftRow>("Drift").implement({
  description: "A disagreement between the books and the live instances (core/books/accounting.ts lists the kinds).",
  fields: (t) => ({
    kind: t.exposeString("kind"),
    subject: t.exposeString("subject"),
    detail: t.exposeString("detail"),
  }),
});

const Accounting = builder.objectRef<{ drift: DriftRow[] }>("Accounting").implement({
  fields: (t) => ({
    consistent: t.boolean({ resolve: (a) => a.drift.length === 0 }),
    drift: t.field({ type: [Drift], resolve: (a) => a.drift }),
  }),
});

builder.objectField(Pool, "accounting", (t) =>
  t.withAuth({ operator: true }).field({
    type: Accounting,
    description: "Operators: the pool's allocations, leases and its tenants' quota charges against its live instances, read now.",
    resolve: async (p, _a, ctx) => ({ drift: await ctx.platform.read((sql) => accountingDrift(sql, p.id)) }),
  }),
);

builder.queryField("doctor", (t) =>
  t.withAuth({ operator: true }).field({
    type: [Finding],
    description: "Operators: what needs fixing — pools, hosts, provider accounts, warm pools, and the accounting audit.",
    resolve: (_r, _a, ctx) => {
      const { config } = ctx.platform;
      return ctx.platform.read((sql) => doctor(sql, { runtimes: config.vps.runtimes, lostGraceMs: config.hosts.lostGraceMs, now: ctx.platform.now() }));
    },
  }),
);
