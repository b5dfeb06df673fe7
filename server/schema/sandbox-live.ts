import { AppError } from "../../contracts/errors.ts";
import { cursorOf, type EventFilter, type WatchedEvent } from "../../core/instances/events.ts";
import { readExec, requestExec } from "../../core/sandboxes/exec.ts";
import { getSandbox, sandboxState } from "../../core/sandboxes/sandboxes.ts";
import type { Context } from "../context.ts";
import { toClientError } from "../errors.ts";
import { type Admitted, builder } from "./builder.ts";
import { watch } from "./events.ts";
import { Sandbox, SandboxState } from "./sandboxes.ts";

/** Sandboxes live: exec output as it comes, and sandbox events resumable by cursor (like instanceEvents). */

const ExecStream = builder.enumType("ExecStream", { values: { STDOUT: {}, STDERR: {}, EXIT: { description: "The last message: the exit code." } } as const });

interface ExecOut {
  stream: "STDOUT" | "STDERR" | "EXIT";
  data: string | null;
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean | null;
  truncated: boolean | null;
}
const ExecOutput = builder.objectRef<ExecOut>("ExecOutput").implement({
  fields: (t) => ({
    stream: t.field({ type: ExecStream, resolve: (o) => o.stream }),
    data: t.exposeString("data", { nullable: true }),
    exitCode: t.exposeInt("exitCode", { nullable: true, description: "EXIT: the command's exit code; null when a signal ended it." }),
    signal: t.exposeString("signal", { nullable: true }),
    timedOut: t.exposeBoolean("timedOut", { nullable: true, description: "EXIT: killed at its timeout." }),
    truncated: t.exposeBoolean("truncated", {
      nullable: true,
      description: "EXIT: output past the server's sandboxes.execOutputBytes was dropped (a note on STDERR says where).",
    }),
  }),
});

const EnvPair = builder.inputType("ExecEnvInput", { fields: (t) => ({ name: t.string({ required: true }), value: t.string({ required: true }) }) });

async function* execStream(ctx: Context, commandId: string): AsyncGenerator<ExecOut> {
  const wake = ctx.platform.bus.subscribe("execOutput", commandId);
  const signal = ctx.live?.signal;
  let seq = -1;
  let woken: Promise<unknown> | null = null;
  try {
    for (;;) {
      const p = await ctx.platform.read((sql) => readExec(sql, commandId, seq, ctx.platform.now()));
      for (const c of p.chunks) {
        seq = c.seq;
        yield { stream: c.stream === "stdout" ? "STDOUT" : "STDERR", data: c.data, exitCode: null, signal: null, timedOut: null, truncated: null };
      }
      if (p.end) {
        // Thrown mid-stream, so past yoga's error mapping: a GraphQLError carries its code to the client itself.
        // A failure the host coded as one the caller gets as an error (a guest that cannot run commands: UNSUPPORTED).
        if (p.end.refusal) throw toClientError(new AppError(p.end.refusal, p.end.error ?? "the exec was refused"), ctx.log, ctx.requestId);
        const r = p.end.result;
        yield {
          stream: "EXIT",
          data: p.end.error,
          exitCode: r?.exitCode ?? null,
          signal: r?.signal ?? null,
          timedOut: r?.timedOut ?? null,
          truncated: p.end.truncated,
        };
        return;
      }
      if (p.chunks.length) continue;
      if (signal?.aborted) return;
      // The bus says "look"; the timer covers a lost message. One look at the bus is kept across waits, and each
      // wait takes its timer and its listener away with it, so a chatty exec leaves nothing behind per chunk.
      woken ??= wake.next().finally(() => {
        woken = null;
      });
      await wakeOrTimeout(woken, 500, signal);
    }
  } finally {
    await wake.return?.();
  }
}

/** Resolves when `woken` settles, `ms` pass or `signal` aborts, whichever is first. */
function wakeOrTimeout(woken: Promise<unknown>, ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
    woken.then(done, done);
  });
}

interface SandboxEventRow {
  event: WatchedEvent;
}
const SandboxEvent = builder.objectRef<SandboxEventRow>("SandboxEvent").implement({
  description: "A change of a sandbox, from its instance's events.",
  fields: (t) => ({
    cursor: t.string({ description: "Pass as `after` to resume right after this event.", resolve: (e) => cursorOf(e.event.position) }),
    sandboxId: t.id({ resolve: (e) => e.event.instance.sandboxId as string }),
    sandbox: t.withAuth({ authenticated: true }).field({
      type: Sandbox,
      nullable: true,
      resolve: (e, _a, ctx) => ctx.platform.read((sql) => getSandbox(sql, ctx.principal, e.event.instance.sandboxId as string)),
    }),
    state: t.field({ type: SandboxState, resolve: (e) => sandboxState(e.event.toState) }),
    instanceState: t.string({ description: "The instance state it moved to.", resolve: (e) => e.event.toState }),
    reason: t.string({ description: "Why: `sandbox:claimed`, `sandbox:ttl`, `sandbox:deleted`, or the instance's reason.", resolve: (e) => e.event.reason }),
    at: t.field({ type: "DateTime", resolve: (e) => e.event.at }),
  }),
});

/** Checks first (so a refusal is the subscription's error, not its stream's), then the stream. */
async function sandboxEvents(ctx: Admitted, sandboxId: string | null, after: string | null | undefined): Promise<AsyncGenerator<SandboxEventRow>> {
  const who = ctx.principal;
  let filter: EventFilter = who.operator ? {} : { tenantId: who.tenantId as string };
  if (sandboxId) {
    const s = await ctx.platform.read((sql) => getSandbox(sql, who, sandboxId));
    if (!s) throw new AppError("NOT_FOUND", `sandbox ${sandboxId} not found`);
    filter = { instanceId: s.instanceId };
  }
  const events = await watch(ctx, filter, after);
  // Instance events of sandboxes only: a warm instance's life before its claim is the operator's, not a sandbox's.
  return (async function* () {
    for await (const event of events) if (event.instance.sandboxId) yield { event };
  })();
}

builder.subscriptionFields((t) => ({
  sandboxExec: t.withAuth({ operator: true, tenantScope: "compute:sandboxes:exec" }).field({
    type: ExecOutput,
    // An exec starts a process on a host and stores what it prints: it costs the caller's budget like a query of a
    // few thousand rows (6 points of the rate limit), not like the few fields it selects.
    complexity: 5000,
    description: "Run a command in a running sandbox: STDOUT and STDERR pieces in order as they come, then one EXIT with its exit code.",
    args: {
      sandboxId: t.arg.id({ required: true }),
      command: t.arg.stringList({ required: true, description: "argv: the program (looked up in PATH without a slash) and its arguments." }),
      env: t.arg({ type: [EnvPair], description: "Added to the template's env." }),
      stdin: t.arg.string(),
      timeoutSeconds: t.arg.int({ description: "Killed past this (default 60, at most 3600)." }),
    },
    subscribe: async (_r, a, ctx) => {
      const who = ctx.principal;
      const { commandId } = await ctx.platform.write({ actor: who.identityId, requestId: ctx.requestId, action: "sandboxExec" }, (w) =>
        requestExec(
          w,
          who,
          String(a.sandboxId),
          {
            command: a.command,
            env: Object.fromEntries((a.env ?? []).map((e) => [e.name, e.value])),
            stdin: a.stdin ?? null,
            timeoutSeconds: a.timeoutSeconds ?? null,
          },
          ctx.platform.config.sandboxes,
        ),
      );
      return execStream(ctx, commandId);
    },
    resolve: (o) => o,
  }),
  sandboxEvents: t.withAuth({ operator: true, tenantScope: "compute:sandboxes:read" }).field({
    type: SandboxEvent,
    description: "Changes of one sandbox, or of every sandbox the caller can see; `after` resumes from a cursor with no gap.",
    args: { sandboxId: t.arg.id(), after: t.arg.string() },
    subscribe: (_r, a, ctx) => sandboxEvents(ctx, a.sandboxId ? String(a.sandboxId) : null, a.after),
    resolve: (e) => e,
  }),
}));
