import { invalid } from "../../contracts/errors.ts";
import { listFlavors } from "../../core/catalog/flavors.ts";
import type { Sql } from "../../core/kernel/db.ts";
import { requirePool } from "../../core/pools/pools.ts";
import {
  createProviderAccount,
  deleteProviderAccount,
  getProviderAccount,
  listProviderAccounts,
  offersOf,
  type ProviderAccount as ProviderAccountRow,
  shownCredentials,
  smallestFitting,
} from "../../core/pools/provider/accounts.ts";
import { accountFences } from "../../infra/providers.ts";
import { mutate } from "../context.ts";
import { builder } from "./builder.ts";

/** Provider accounts and what they offer: operators manage accounts; anyone who can read pools sees offers. */

interface OfferRow {
  name: string;
  vcpus: number;
  memoryMib: number;
  diskGib: number;
  refreshedAt: Date;
  flavors: string[];
}

const ProviderOffer = builder.objectRef<OfferRow>("ProviderOffer").implement({
  description: "A machine type the provider sells, as the worker last read it, and the pool's flavors that map to it.",
  fields: (t) => ({
    name: t.exposeString("name"),
    vcpus: t.exposeInt("vcpus"),
    memoryMib: t.exposeInt("memoryMib"),
    diskGib: t.exposeInt("diskGib"),
    refreshedAt: t.expose("refreshedAt", { type: "DateTime" }),
    flavors: t.exposeStringList("flavors", { description: "Flavors whose instances get this machine type: it is the smallest that holds them." }),
  }),
});

const ProviderOrphan = builder.objectRef<{ externalId: string; instanceId: string | null; firstSeenAt: Date }>("ProviderOrphan").implement({
  description: "A machine labelled as this deployment's that no live instance owns; removed once the grace has passed.",
  fields: (t) => ({
    externalId: t.exposeString("externalId"),
    instanceId: t.exposeString("instanceId", { nullable: true }),
    firstSeenAt: t.expose("firstSeenAt", { type: "DateTime" }),
  }),
});

/** Offers with the flavors of `poolId` (if any) that map to each. */
async function offersWithFlavors(sql: Sql, accountId: string, poolId: string | null): Promise<OfferRow[]> {
  const offers = await offersOf(sql, accountId);
  const flavors = poolId ? await listFlavors(sql, poolId) : [];
  return offers.map((o) => ({ ...o, flavors: flavors.filter((f) => smallestFitting(offers, f)?.name === o.name).map((f) => f.name) }));
}

const ProviderAccount = builder.objectRef<ProviderAccountRow>("ProviderAccount").implement({
  description: "An account on an external cloud. Credentials are shown as their references (`env:NAME`, `file:/path`, `sealed`), never as values.",
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    provider: t.exposeString("provider"),
    config: t.expose("config", { type: "JSON" }),
    credentials: t.field({ type: "JSON", resolve: (a) => shownCredentials(a.credentials) }),
    offers: t.field({ type: [ProviderOffer], resolve: (a, _x, ctx) => ctx.platform.read((sql) => offersWithFlavors(sql, a.id, null)) }),
    orphans: t.field({
      type: [ProviderOrphan],
      resolve: (a, _x, ctx) =>
        ctx.platform.read((sql) =>
          sql.query<{ externalId: string; instanceId: string | null; firstSeenAt: Date }>(
            `SELECT external_id AS "externalId", instance_id AS "instanceId", first_seen_at AS "firstSeenAt"
               FROM provider_orphans WHERE account_id = $1 ORDER BY first_seen_at, external_id`,
            [a.id],
          ),
        ),
    }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

const CreateProviderAccountInput = builder.inputType("CreateProviderAccountInput", {
  fields: (t) => ({
    name: t.string({ required: true }),
    provider: t.string({ required: true, description: "A provider the deployment lists (`hetzner-cloud`, `proxmox-ve`)." }),
    config: t.field({ type: "JSON", required: true, description: "The provider's account settings, checked by its schema." }),
    credentials: t.field({
      type: "JSON",
      description: 'Each credential the provider names: "env:NAME", "file:/absolute/path", or { "value": "…" } to seal it at rest.',
    }),
  }),
});

builder.queryFields((t) => ({
  providerAccounts: t.withAuth({ operator: true }).field({
    type: [ProviderAccount],
    resolve: (_r, _a, ctx) => ctx.platform.read(listProviderAccounts),
  }),
  providerAccount: t.withAuth({ operator: true }).field({
    type: ProviderAccount,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => (await ctx.platform.read((sql) => getProviderAccount(sql, String(id)))) ?? null,
  }),
  providerOffers: t.withAuth({ operator: true, tenantScope: "compute:pools:read" }).field({
    type: [ProviderOffer],
    description: "A provider pool's offers and the flavors that map to each; UNSCHEDULABLE awaits a flavor that maps to none.",
    args: { poolId: t.arg.id({ required: true }) },
    resolve: (_r, { poolId }, ctx) =>
      ctx.platform.read(async (sql) => {
        const pool = await requirePool(sql, String(poolId));
        if (!pool.providerAccountId) throw invalid(`pool ${pool.name} is not a provider pool: it has no offers`, { path: "poolId" });
        return offersWithFlavors(sql, pool.providerAccountId, pool.id);
      }),
  }),
}));

builder.mutationFields((t) => ({
  createProviderAccount: t.withAuth({ operator: true }).field({
    type: ProviderAccount,
    args: { input: t.arg({ type: CreateProviderAccountInput, required: true }) },
    resolve: (_r, { input }, ctx, info) => {
      const deps = { providers: ctx.platform.config.vps.providers, sealer: ctx.platform.sealer, fences: accountFences(ctx.platform.config) };
      return mutate(ctx, info, (w) => createProviderAccount(w, deps, input));
    },
  }),
  deleteProviderAccount: t.withAuth({ operator: true }).field({
    type: ProviderAccount,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx, info) => mutate(ctx, info, (w) => deleteProviderAccount(w, String(id))),
  }),
}));
