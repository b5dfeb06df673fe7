import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { applySpecChange, hostSpecChange, type NodeSpec, type StatusReport } from "../contracts/host.ts";
import {
  createClient,
  createWsClient,
  JoinNodeDocument,
  NodeCommandsDocument,
  NodeSpecChangesDocument,
  ReportCommandDocument,
  ReportExecOutputDocument,
  ReportStatusDocument,
  SdkError,
} from "../sdk/client.ts";
import { CommandRunner } from "./commands/index.ts";
import { Converger, type EgressRules } from "./converge.ts";
import { InstanceLocks } from "./locks.ts";
import type { Runtime } from "./runtimes/runtime.ts";

export interface AgentOptions {
  /** The server's GraphQL URL. */
  server: string;
  /** Needed only the first time: the credential it is traded for is kept in `stateDir`. */
  joinToken?: string;
  name: string;
  stateDir: string;
  runtime: Runtime;
  heartbeatMs?: number;
  /**
   * Enforces sandboxes' egress policies on the host (agent/network/egress.ts), by tap name. Applied with each
   * converge pass (converge.ts), so a tap is classified before its guest boots; a tap with no policy is dropped meanwhile.
   */
  egress?: EgressRules;
  log?: (msg: string, fields?: Record<string, unknown>) => void;
}

interface Identity {
  nodeId: string;
  credential: string;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const REQUEST_TIMEOUT_MS = 15_000;
/** The longest a status report waits for the command reports ahead of it (commands/index.ts, reportsSent). */
const REPORT_BEHIND_COMMANDS_MS = 1_000;
/** The longest a converge pass waits for the pauses and resumes under way (commands/index.ts, powerDone). */
const POWER_FIRST_MS = 1_000;

/**
 * A host agent: joins once, then subscribes to its node's spec, converges the runtime to the newest spec it
 * has (one pass at a time; a spec arriving mid-pass triggers another), reports after each pass and as a
 * heartbeat, and survives server restarts by reconnecting and taking the spec the server sends first. Host
 * commands run beside the passes, each holding its instance's lock (./locks.ts).
 */
export async function startAgent(opts: AgentOptions) {
  const log = opts.log ?? (() => {});
  const identity = await ensureIdentity(opts, log);
  // A request the server never answers (a connection lost on the way, a server stuck) must not silence the host:
  // reports and command reports give up, and the next report or retry goes on a new request.
  const http = createClient({ url: opts.server, token: identity.credential, timeoutMs: REQUEST_TIMEOUT_MS });
  // Reports go over the websocket the spec and commands come on while it is open (no request to make, parse and
  // authenticate each time: a warm claim waits on one), and over HTTP while it is not.
  let ws: Awaited<ReturnType<typeof createWsClient>> | undefined;
  const call: typeof http.request = (doc, ...vars) => (ws?.connected() ? ws.request(doc, ...vars) : http.request(doc, ...vars));
  const locks = new InstanceLocks();
  const converger = new Converger(opts.runtime, (id, e) => log("runtime refused", { id, err: String(e) }), locks, opts.egress);
  const commands = new CommandRunner({
    stateDir: opts.stateDir,
    runtime: opts.runtime,
    locks,
    onPower: (id, generation) => converger.powerAhead(id, generation),
    log,
    send: async (report) => {
      try {
        await call(ReportCommandDocument, { report });
      } catch (e) {
        // The server's final word on the report (it knows no such command of this node, or refuses the
        // report's shape): sending it again would get the same answer forever.
        if (e instanceof SdkError && (e.code === "NOT_FOUND" || e.code === "INVALID_INPUT"))
          return log("command report refused", { id: report.id, err: String(e) });
        throw e;
      }
    },
    sendOutput: async (commandId, chunks) => {
      try {
        await call(ReportExecOutputDocument, { commandId, chunks });
      } catch (e) {
        // As for reports: the server's final word on this output; it would refuse it again.
        if (e instanceof SdkError && (e.code === "NOT_FOUND" || e.code === "INVALID_INPUT"))
          return log("exec output refused", { id: commandId, err: String(e) });
        throw e;
      }
    },
  });
  let latest: NodeSpec | null = null;
  let converged = 0;
  let running: Promise<void> | null = null;
  let wantPass = false;
  let wantReport = false;
  let closed = false;

  // Reports leave one at a time, in the order they were taken, so the server never gets an older view after
  // a newer one. `last` is the newest one taken between passes: whole, never halfway through a pass. The loop
  // does not wait for the server's answer (which includes the reconcile passes the report set off): the next
  // spec is converged meanwhile. A report taken while another is on its way replaces any not yet sent: the
  // newer view says all the older one would have.
  let sending: Promise<void> | null = null;
  let unsent: StatusReport | null = null;
  let last: StatusReport | null = null;
  const send = (report: StatusReport) => {
    unsent = report;
    sending ??= (async () => {
      while (unsent) {
        await commands.reportsSent(REPORT_BEHIND_COMMANDS_MS);
        // Taken after the wait: a report made meanwhile replaced this one.
        const next = unsent as StatusReport;
        unsent = null;
        await call(ReportStatusDocument, { report: next }).catch((e) => log("report failed", { err: String(e) }));
      }
      sending = null;
    })();
  };
  const report = async () => {
    try {
      last = await converger.report(converged);
    } catch (e) {
      return log("report failed", { err: String(e) });
    }
    send(last);
  };
  // Passes and reports take turns in one loop, so a report never reads the host halfway through a pass; a
  // spec arriving during a pass makes the loop go round again. `running` is cleared in the same tick as the
  // last check of what is wanted, so nothing asked for in between is left undone.
  const loop = async () => {
    while ((wantPass || wantReport) && !closed) {
      await commands.powerDone(POWER_FIRST_MS);
      const spec = wantPass ? latest : null;
      wantPass = false;
      wantReport = false;
      if (spec) {
        try {
          // Instances a command held were skipped; the command's release asks for another pass. The
          // generation still counts as applied: every other instance has it, and held ones report as pinned.
          // A spec refused whole (another runtime's pool) is answered too: the report says why.
          const { refused } = await converger.converge(spec);
          if (refused) log("spec refused", { generation: spec.generation, why: refused });
          converged = spec.generation;
        } catch (e) {
          log("converge failed", { err: String(e) });
        }
      }
      await report();
    }
    running = null;
  };
  const schedule = (what: "pass" | "report") => {
    if (what === "pass") wantPass = true;
    else wantReport = true;
    if (!running) running = loop();
  };
  const kick = () => schedule("pass");
  // A quiet command (pause, resume, exec) changes nothing a pass would act on, unless a pass skipped its
  // instance meanwhile; a pass after each would only compete with the command's report.
  locks.onCommandRelease((id, quiet) => {
    if (converger.takeHeldBack(id) || !quiet) kick();
  });
  // A domain a command was in the middle of when the agent died is the command's before the first pass.
  await commands.recover();
  void commands.prune().catch((e) => log("pruning command journals failed", { err: String(e) }));
  const pruning = setInterval(() => void commands.prune().catch((e) => log("pruning command journals failed", { err: String(e) })), 60 * 60 * 1000);
  pruning.unref();

  // The heartbeat reports, and re-runs a pass if the newest spec is somehow not applied yet. Liveness never
  // waits on the runtime: while the loop is busy (a pass that downloads an image, a report whose hypervisor
  // calls are slow during a save), the last whole report goes again, so the server still hears from the host
  // without ever seeing a pass half applied.
  const heartbeat = setInterval(() => {
    if (!running) schedule(latest && latest.generation > converged ? "pass" : "report");
    else if (last && !sending) send(last);
  }, opts.heartbeatMs ?? 5000);
  let giveUp: (why: string) => void = () => {};
  const ended = new Promise<string>((resolve) => {
    giveUp = resolve;
  });
  ws = await createWsClient({
    url: opts.server,
    token: identity.credential,
    timeoutMs: REQUEST_TIMEOUT_MS,
    onConnected: () => {
      log("connected");
      void commands.resendUnconfirmed().catch((e) => log("re-sending command reports failed", { err: String(e) }));
    },
  });
  // Both streams retry with backoff. 4401: the server no longer knows this node's credential (declared gone,
  // or revoked); retrying cannot help, the host has to join again with a new token.
  const stream = async <T>(what: string, open: () => AsyncIterable<T>, take: (payload: T) => void) => {
    for (let attempt = 0; !closed; attempt++) {
      try {
        for await (const payload of open()) {
          attempt = 0;
          take(payload);
        }
      } catch (e) {
        if (closed) return;
        if ((e as { code?: number })?.code === 4401) {
          closed = true;
          clearInterval(heartbeat);
          clearInterval(pruning);
          giveUp(`node ${identity.nodeId}: the server refused its credential (${(e as { reason?: string }).reason ?? "4401"}); join again with a new token`);
          return;
        }
        log(`${what} stream interrupted`, { err: String(e) });
      }
      await sleep(Math.min(10_000, 250 * 2 ** attempt));
    }
  };
  const follow = Promise.all([
    stream(
      "spec",
      () => ws.subscribe(NodeSpecChangesDocument),
      (payload) => {
        // Policies are checked per instance by the converger: one the host cannot enforce must not stop the stream.
        const change = hostSpecChange.parse(payload.nodeSpecChanges.change);
        // A change that does not follow the spec held throws: the stream starts again, from a whole spec.
        latest = applySpecChange(latest, change);
        kick();
      },
    ),
    // A command comes again after every reconnect until it is finished: the runner's journal makes that harmless.
    stream(
      "command",
      () => ws.subscribe(NodeCommandsDocument),
      (payload) => void commands.receive(payload.nodeCommands.command),
    ),
  ]);

  return {
    nodeId: identity.nodeId,
    /** The generation of the last spec fully applied. */
    converged: () => converged,
    /**
     * Resolves once the agent has nothing under way: no pass or report being made or sent, no command running
     * or with a report on its way. What arrives afterwards starts it again.
     */
    async idle() {
      while (running || sending || commands.busy()) await Promise.allSettled([running, sending, commands.settled(), commands.reportsSent(REQUEST_TIMEOUT_MS)]);
    },
    /** Settles, with the reason, if the agent gives up for good (its credential was refused). */
    ended,
    async close() {
      closed = true;
      clearInterval(heartbeat);
      clearInterval(pruning);
      await ws.dispose();
      await Promise.race([follow, sleep(1000)]);
      await running;
      await sending;
      await commands.close();
      await opts.runtime.close();
    },
  };
}

/** The node credential from the state dir, or trade the join token for one (retrying while the server starts). */
async function ensureIdentity(opts: AgentOptions, log: NonNullable<AgentOptions["log"]>): Promise<Identity> {
  const file = join(opts.stateDir, "agent.json");
  if (existsSync(file)) return JSON.parse(readFileSync(file, "utf8")) as Identity;
  if (!opts.joinToken) throw new Error(`no credential in ${file} and no join token to get one`);
  const anon = createClient({ url: opts.server });
  for (let attempt = 0; ; attempt++) {
    try {
      const { joinNode } = await anon.request(JoinNodeDocument, { token: opts.joinToken, name: opts.name });
      const identity = { nodeId: joinNode.nodeId, credential: joinNode.credential };
      mkdirSync(opts.stateDir, { recursive: true, mode: 0o700 });
      writeFileSync(`${file}.tmp`, JSON.stringify(identity), { mode: 0o600 });
      renameSync(`${file}.tmp`, file);
      return identity;
    } catch (e) {
      // A refused token is final; a server that is not up yet is worth waiting for.
      if (e instanceof SdkError && e.code !== "INTERNAL" && !e.code.startsWith("HTTP_")) throw e;
      if (attempt >= 60) throw e;
      log("waiting for the server", { err: String(e) });
      await sleep(Math.min(5000, 200 * 2 ** attempt));
    }
  }
}
