import { z } from "zod";
import { statusReport } from "../../contracts/host.ts";
import { requireAuth, requireNode, requireOperator } from "../../core/auth/principal.ts";
import { parseInput } from "../../core/catalog/shapes.ts";
import { buildNodeSpec, createJoinToken, declareNodeGone, joinNode, recordReport } from "../../core/pools/hosted/hosts.ts";
import type { Context } from "../context.ts";
import { builder } from "./builder.ts";

/** The host gateway: how agents join, receive their node's spec and report what they see. */

const JoinToken = builder.objectRef<{ token: string; expiresAt: Date; poolId: string }>("JoinToken").implement({
  description: "Single use, short lived; an agent trades it for a node credential. Shown once.",
  fields: (t) => ({ token: t.exposeString("token"), expiresAt: t.expose("expiresAt", { type: "DateTime" }), poolId: t.exposeID("poolId") }),
});

const NodeCredential = builder.objectRef<{ nodeId: string; credential: string; poolId: string }>("NodeCredential").implement({
  description: "What an agent keeps to act as its node: the credential reads and reports for this node only.",
  fields: (t) => ({ nodeId: t.exposeID("nodeId"), poolId: t.exposeID("poolId"), credential: t.exposeString("credential") }),
});

const ReportAck = builder.objectRef<{ generation: number }>("ReportAck").implement({
  fields: (t) => ({ generation: t.exposeInt("generation", { description: "The node's current spec generation." }) }),
});

const NodeSpecPayload = builder.objectRef<{ generation: number; spec: unknown }>("NodeSpecPayload").implement({
  description: "A node's whole desired set; `spec` follows the NodeSpec schema of core/protocol.ts.",
  fields: (t) => ({ generation: t.exposeInt("generation"), spec: t.expose("spec", { type: "JSON" }) }),
});

builder.mutationFields((t) => ({
  createJoinToken: t.field({
    type: JoinToken,
    args: { poolId: t.arg.id({ required: true }), ttlSeconds: t.arg.int() },
    resolve: (_r, { poolId, ttlSeconds }, ctx) => {
      requireOperator(ctx.principal);
      const ttl = parseInput(
        z
          .number()
          .int()
          .min(10)
          .max(7 * 24 * 3600),
        ttlSeconds ?? ctx.platform.config.hosts.joinTokenTtlSeconds,
        "ttlSeconds",
      );
      return ctx.platform.write((sql) => createJoinToken(sql, ctx.platform.ids, String(poolId), ttl, ctx.platform.now()));
    },
  }),
  joinNode: t.field({
    type: NodeCredential,
    description: "Trade a join token (the bearer of this call need not be authenticated) for a node and its credential.",
    args: { token: t.arg.string({ required: true }), name: t.arg.string({ required: true }) },
    resolve: (_r, { token, name }, ctx) => ctx.platform.write((sql) => joinNode(sql, ctx.platform.ids, token, name, ctx.platform.now())),
  }),
  reportStatus: t.field({
    type: ReportAck,
    description: "A host's StatusReport (core/protocol.ts): sent on every change and as a heartbeat.",
    args: { report: t.arg({ type: "JSON", required: true }) },
    resolve: async (_r, { report }, ctx) => {
      const nodeId = requireNode(ctx.principal);
      const parsed = parseInput(statusReport, report, "report");
      const { platform } = ctx;
      const result = await platform.write((sql) => recordReport(sql, nodeId, parsed, platform.now()));
      for (const instanceId of result.wake) await platform.jobs.enqueue("vps.instances", { instanceId });
      return { generation: result.generation };
    },
  }),
  declareNodeGone: t.field({
    type: "Boolean",
    description: "The host will not come back: revoke its credential and recreate its instances elsewhere.",
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => {
      requireOperator(ctx.principal);
      const wake = await ctx.platform.write(async (sql, emit) => {
        const found = await declareNodeGone(sql, String(id), ctx.platform.now());
        emit({ event: null, revoked: [`node:${id}`] });
        return found;
      });
      for (const instanceId of wake) await ctx.platform.jobs.enqueue("vps.instances", { instanceId });
      return true;
    },
  }),
}));

const SPEC_COALESCE_MS = 25;

/**
 * The spec stream: the current spec at once (so a reconnecting agent resumes from the latest), then a new
 * one whenever the generation moves. The bus is read from the start, before the first spec is built: a
 * subscription only becomes live once something pulls from it, and a change in that gap would be lost.
 */
async function* specStream(ctx: Context, nodeId: string) {
  const { platform } = ctx;
  const changes = platform.bus.subscribe("nodeSpecs", nodeId);
  const seen = { newest: -1, ended: false, wake: null as (() => void) | null };
  const pump = (async () => {
    for await (const m of changes) {
      seen.newest = Math.max(seen.newest, m.generation);
      seen.wake?.();
    }
  })().finally(() => {
    seen.ended = true;
    seen.wake?.();
  });
  const read = () => platform.db.transaction((sql) => buildNodeSpec(sql, platform.sealer, { hostNetwork: platform.config.vps.hostNetwork }, nodeId));
  let lastReadAt = Date.now();
  try {
    let last = await read();
    yield { generation: last.generation, spec: last };
    while (!seen.ended) {
      if (seen.newest <= last.generation) {
        await new Promise<void>((r) => {
          seen.wake = r;
        });
        seen.wake = null;
        continue;
      }
      // A lone change goes out at once; in a burst (a read less than SPEC_COALESCE_MS ago) the rest of the
      // burst lands first and becomes one rebuild, so a host taking hundreds of instances is not sent hundreds
      // of specs.
      const since = Date.now() - lastReadAt;
      await new Promise((r) => (since < SPEC_COALESCE_MS ? setTimeout(r, SPEC_COALESCE_MS - since) : setImmediate(r)));
      lastReadAt = Date.now();
      const spec = await read();
      if (spec.generation <= last.generation) continue;
      last = spec;
      yield { generation: spec.generation, spec };
    }
  } finally {
    await changes.return?.();
    await pump;
  }
}

builder.subscriptionField("nodeSpec", (t) =>
  t.field({
    type: NodeSpecPayload,
    description: "Host agents: the desired set of the node the credential belongs to.",
    subscribe: (_r, _a, ctx) => {
      requireAuth(ctx.principal);
      return specStream(ctx, requireNode(ctx.principal));
    },
    resolve: (payload) => payload,
  }),
);
