import { z } from "zod";
import type { Channels } from "../../contracts/channels.ts";
import { commandReport, execChunk, type HostCommand, type NodeSpecChange, statusReport } from "../../contracts/host.ts";
import { tracePoint } from "../../contracts/trace.ts";
import { commandsForNode } from "../../core/commands/commands.ts";
import { recordHostReport } from "../../core/commands/reports.ts";
import { parseInput } from "../../core/kernel/validation.ts";
import { INLINE_PASSES, reconcileNews } from "../../core/lifecycle/reconciler.ts";
import { createJoinToken, joinNode } from "../../core/pools/hosted/enrollment.ts";
import { declareNodeGone } from "../../core/pools/hosted/nodes.ts";
import { recordReport } from "../../core/pools/hosted/reports.ts";
import { buildNodeSpec, buildNodeSpecChange } from "../../core/pools/hosted/spec.ts";
import { recordExecOutput } from "../../core/sandboxes/exec.ts";
import { type Context, mutate } from "../context.ts";
import { builder } from "./builder.ts";

/**
 * The host gateway: how agents join, receive their node's spec and commands, and report what they see and do.
 * The host protocol itself (what a spec, a report and a command hold) is contracts/host.ts.
 */

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

const CommandAck = builder.objectRef<{ id: string; state: string }>("CommandAck").implement({
  description: "The command as the server now records it; a report that came too late or twice changes nothing.",
  fields: (t) => ({ id: t.exposeID("id"), state: t.exposeString("state") }),
});

const NodeSpecPayload = builder.objectRef<{ generation: number; spec: unknown }>("NodeSpecPayload").implement({
  description: "A node's whole desired set; `spec` follows the NodeSpec schema of the host protocol.",
  fields: (t) => ({ generation: t.exposeInt("generation"), spec: t.expose("spec", { type: "JSON" }) }),
});

const NodeSpecChangePayload = builder.objectRef<{ generation: number; change: unknown }>("NodeSpecChangePayload").implement({
  description: "A node's desired set, whole at first and then what changed; `change` follows the NodeSpecChange schema of the host protocol.",
  fields: (t) => ({ generation: t.exposeInt("generation"), change: t.expose("change", { type: "JSON" }) }),
});

const NodeCommandPayload = builder.objectRef<{ command: unknown }>("NodeCommandPayload").implement({
  description: "One host command (the HostCommand schema of the host protocol).",
  fields: (t) => ({ command: t.expose("command", { type: "JSON" }) }),
});

const ttlSeconds = z
  .number()
  .int()
  .min(10)
  .max(7 * 24 * 3600);

builder.mutationFields((t) => ({
  createJoinToken: t.withAuth({ operator: true }).field({
    type: JoinToken,
    args: { poolId: t.arg.id({ required: true }), ttlSeconds: t.arg.int() },
    resolve: (_r, args, ctx, info) => {
      const ttl = parseInput(ttlSeconds, args.ttlSeconds ?? ctx.platform.config.hosts.joinTokenTtlSeconds, "ttlSeconds");
      return mutate(ctx, info, (w) => createJoinToken(w, String(args.poolId), ttl));
    },
  }),
  joinNode: t.withAuth({ public: true }).field({
    type: NodeCredential,
    description: "Trade a join token (the bearer of this call need not be authenticated) for a node and its credential.",
    args: { token: t.arg.string({ required: true }), name: t.arg.string({ required: true }) },
    resolve: (_r, { token, name }, ctx, info) => mutate(ctx, info, (w) => joinNode(w, token, name)),
  }),
  reportStatus: t.withAuth({ node: true }).field({
    type: ReportAck,
    description: "A host's StatusReport (host protocol): sent on every change and as a heartbeat.",
    args: { report: t.arg({ type: "JSON", required: true }) },
    resolve: async (_r, { report }, ctx, info) => {
      const { nodeId } = ctx.principal;
      const parsed = parseInput(statusReport, report, "report");
      const ack = await mutate(ctx, info, (w) => recordReport(w, nodeId, parsed, { passesHereUpTo: INLINE_PASSES }));
      // The news is here: its reconcile passes need no trip through the job queue; one that fails goes there.
      await reconcileNews(
        (fn) => ctx.platform.write({ actor: "reconciler", requestId: ctx.requestId }, fn),
        ctx.platform.drivers,
        ack.passesHere,
        (id, e) => {
          ctx.log.warn("a report's reconcile pass failed; its job will retry", { instanceId: id, err: String(e) });
          void ctx.platform.jobs.enqueue("vps.instances", { instanceId: id }).catch(() => {});
        },
      );
      return ack;
    },
  }),
  reportCommand: t.withAuth({ node: true }).field({
    type: CommandAck,
    description: "A host's word on one of its node's commands: `running` when it takes it, then `succeeded` or `failed`.",
    args: { report: t.arg({ type: "JSON", required: true }) },
    resolve: (_r, { report }, ctx, info) => {
      const { nodeId } = ctx.principal;
      const parsed = parseInput(commandReport, report, "report");
      return mutate(parsed.bulk ? bulkLane(ctx, nodeId) : ctx, info, (w) => recordHostReport(w, nodeId, parsed));
    },
  }),
  reportExecOutput: t.withAuth({ node: true }).field({
    type: "Boolean",
    description: "A host's output of one of its node's exec commands: numbered chunks, each stored once.",
    args: { commandId: t.arg.id({ required: true }), chunks: t.arg({ type: "JSON", required: true }) },
    resolve: (_r, { commandId, chunks }, ctx, info) => {
      const { nodeId } = ctx.principal;
      const parsed = parseInput(z.array(execChunk).max(1000), chunks, "chunks");
      return mutate(bulkLane(ctx, nodeId), info, (w) => recordExecOutput(w, nodeId, String(commandId), parsed, ctx.platform.config.sandboxes.execOutputBytes));
    },
  }),
  declareNodeGone: t.withAuth({ operator: true }).field({
    type: "Boolean",
    description: "The host will not come back: revoke its credential and recreate its instances elsewhere.",
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx, info) => {
      await mutate(ctx, info, (w) => declareNodeGone(w, String(id)));
      return true;
    },
  }),
}));

/**
 * A tenant's work riding a host's credential (an exec's reports and output): it takes its turn with API work, in
 * a lane of its own per node, not ahead of it as the host's own state does, so an exec storm cannot hold up
 * other tenants' reads.
 */
const bulkLane = (ctx: Context, nodeId: string): Context => ({ ...ctx, platform: ctx.platform.api(`host-bulk:${nodeId}`) });

const SPEC_COALESCE_MS = 5;

/**
 * Follow a node-keyed bus channel: yields `read()`'s result at once (so a reconnecting agent resumes from the
 * latest) and again whenever a message brings news (`news`: by default every message). The bus is read from the start, before the first read: a
 * subscription only becomes live once something pulls from it, and a change in that gap would be lost. In a
 * burst (a read less than SPEC_COALESCE_MS ago) the rest of the burst lands first and becomes one read.
 */
async function* follow<T, C extends "nodeSpecs" | "hostCommands">(
  ctx: Context,
  channel: C,
  nodeId: string,
  read: () => Promise<T>,
  news: (m: Channels[C]) => boolean = () => true,
  coalesceMs = SPEC_COALESCE_MS,
): AsyncGenerator<T> {
  const changes = ctx.platform.bus.subscribe(channel, nodeId);
  const seen = { dirty: false, ended: false, wake: null as (() => void) | null };
  // A quiet node's channel may stay silent for hours: the connection's end must stop the stream by itself.
  const stop = () => void changes.return?.();
  ctx.live?.signal.addEventListener("abort", stop, { once: true });
  const pump = (async () => {
    for await (const m of changes) {
      if (!news(m)) continue;
      seen.dirty = true;
      seen.wake?.();
    }
  })().finally(() => {
    seen.ended = true;
    seen.wake?.();
  });
  let lastReadAt = Date.now();
  try {
    yield await read();
    while (!seen.ended) {
      if (!seen.dirty) {
        await new Promise<void>((r) => {
          seen.wake = r;
        });
        seen.wake = null;
        continue;
      }
      // Without coalescing (commands) the read goes at once: it takes only what the messages carried.
      const since = Date.now() - lastReadAt;
      if (coalesceMs > 0) await new Promise((r) => (since < coalesceMs ? setTimeout(r, coalesceMs - since) : setImmediate(r)));
      seen.dirty = false;
      lastReadAt = Date.now();
      yield await read();
    }
  } finally {
    ctx.live?.signal.removeEventListener("abort", stop);
    await changes.return?.();
    await pump;
  }
}

/** The spec stream: a new spec whenever the node's generation moves past the last one sent. */
async function* specStream(ctx: Context, nodeId: string) {
  const { platform } = ctx;
  let last = -1;
  const read = () => platform.read((sql) => buildNodeSpec(sql, platform.sealer, platform.config.vps.hostNetwork, nodeId));
  // A generation already sent (the sweep announces unacknowledged ones again) needs no read.
  for await (const spec of follow(ctx, "nodeSpecs", nodeId, read, (m) => m.generation > last)) {
    if (spec.generation <= last) continue;
    last = spec.generation;
    yield { generation: spec.generation, spec };
  }
}

/**
 * The spec stream as changes: the whole spec first, then for each new generation only the instances whose spec
 * moved or that joined the set, and the ids that left it. A host of 128 instances hears of one instance's change
 * in about its size, not the host's.
 */
async function* specChangeStream(ctx: Context, nodeId: string) {
  const { platform } = ctx;
  const { sealer } = platform;
  const network = platform.config.vps.hostNetwork;
  let last = -1;
  let held = new Set<string>();
  const read = () =>
    platform.read(async (sql): Promise<NodeSpecChange> => {
      if (last < 0) {
        const spec = await buildNodeSpec(sql, sealer, network, nodeId);
        return { ...spec, since: null, dropped: [] };
      }
      return buildNodeSpecChange(sql, sealer, network, nodeId, last, held);
    });
  for await (const change of follow(ctx, "nodeSpecs", nodeId, read, (m) => m.generation > last)) {
    if (change.generation <= last) continue;
    if (change.since === null) held = new Set(change.instances.map((i) => i.id));
    else {
      for (const id of change.dropped) held.delete(id);
      for (const i of change.instances) held.add(i.id);
    }
    last = change.generation;
    yield { generation: change.generation, change };
  }
}

/**
 * The command stream: every command the node should be working on, each once per stream. A new stream (the
 * agent reconnected, or this server restarted) sends the unfinished ones again: the agent keys its work by id.
 */
async function* commandStream(ctx: Context, nodeId: string) {
  const { platform } = ctx;
  const sent = new Set<string>();
  // New commands ride on their message and go out as they are; only the first look (and a message without
  // them) reads the table. Nothing is coalesced: a warm claim's resume is waiting on this.
  let carried: HostCommand[] = [];
  let mustRead = true;
  const news = (m: Channels["hostCommands"]) => {
    if (m.commands) carried.push(...m.commands);
    else mustRead = true;
    return true;
  };
  const read = async () => {
    const ready = carried;
    carried = [];
    if (!mustRead) return ready;
    mustRead = false;
    return platform.read((sql) => commandsForNode(sql, nodeId, platform.now()));
  };
  for await (const commands of follow(ctx, "hostCommands", nodeId, read, news, 0)) {
    for (const command of commands) {
      if (sent.has(command.id)) continue;
      sent.add(command.id);
      tracePoint("command.sent", `${command.kind} ${command.id}`);
      yield { command };
    }
  }
}

builder.subscriptionFields((t) => ({
  nodeSpec: t.withAuth({ node: true }).field({
    type: NodeSpecPayload,
    description: "Host agents: the desired set of the node the credential belongs to.",
    subscribe: (_r, _a, ctx) => specStream(ctx, ctx.principal.nodeId),
    resolve: (payload) => payload,
  }),
  nodeSpecChanges: t.withAuth({ node: true }).field({
    type: NodeSpecChangePayload,
    description: "Host agents: the desired set of the node the credential belongs to, whole first and then as changes.",
    subscribe: (_r, _a, ctx) => specChangeStream(ctx, ctx.principal.nodeId),
    resolve: (payload) => payload,
  }),
  nodeCommands: t.withAuth({ node: true }).field({
    type: NodeCommandPayload,
    description: "Host agents: the one-shot commands for the node the credential belongs to, unfinished ones first.",
    subscribe: (_r, _a, ctx) => commandStream(ctx, ctx.principal.nodeId),
    resolve: (payload) => payload,
  }),
}));
