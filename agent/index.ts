import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type NodeSpec, nodeSpec } from "../contracts/host.ts";
import { createClient, createWsClient, JoinNodeDocument, NodeSpecDocument, ReportStatusDocument, SdkError } from "../sdk/client.ts";
import { Converger } from "./converge.ts";
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
  log?: (msg: string, fields?: Record<string, unknown>) => void;
}

interface Identity {
  nodeId: string;
  credential: string;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A host agent: joins once, then subscribes to its node's spec, converges the runtime to the newest spec it
 * has (one pass at a time; a spec arriving mid-pass triggers another), reports after each pass and as a
 * heartbeat, and survives server restarts by reconnecting and taking the spec the server sends first.
 */
export async function startAgent(opts: AgentOptions) {
  const log = opts.log ?? (() => {});
  const identity = await ensureIdentity(opts, log);
  const http = createClient({ url: opts.server, token: identity.credential });
  const converger = new Converger(opts.runtime, (id, e) => log("runtime refused", { id, err: String(e) }));
  let latest: NodeSpec | null = null;
  let converged = 0;
  let running: Promise<void> | null = null;
  let again = false;
  let closed = false;

  const report = async () => {
    try {
      await http.request(ReportStatusDocument, { report: await converger.report(converged) });
    } catch (e) {
      log("report failed", { err: String(e) });
    }
  };
  // One pass at a time; a spec arriving during a pass makes the loop go round again. `running` is cleared in
  // the same tick as the last check of `again`, so no spec can slip in between and be left unapplied.
  const pass = async () => {
    while (again && !closed) {
      again = false;
      const spec = latest;
      if (!spec) break;
      try {
        await converger.converge(spec);
        converged = spec.generation;
      } catch (e) {
        log("converge failed", { err: String(e) });
      }
      await report();
    }
    running = null;
  };
  const kick = () => {
    again = true;
    if (!running) running = pass();
  };

  // The heartbeat reports, and re-runs a pass if the newest spec is somehow not applied yet.
  const heartbeat = setInterval(() => (latest && latest.generation > converged ? kick() : void report()), opts.heartbeatMs ?? 5000);
  let giveUp: (why: string) => void = () => {};
  const ended = new Promise<string>((resolve) => {
    giveUp = resolve;
  });
  const ws = await createWsClient({ url: opts.server, token: identity.credential, onConnected: () => log("connected") });
  const follow = (async () => {
    for (let attempt = 0; !closed; attempt++) {
      try {
        for await (const payload of ws.subscribe(NodeSpecDocument)) {
          attempt = 0;
          const spec = nodeSpec.parse(payload.nodeSpec.spec);
          if (latest && spec.generation < latest.generation) continue;
          latest = spec;
          kick();
        }
      } catch (e) {
        if (closed) return;
        // 4401: the server no longer knows this node's credential (declared gone, or revoked). Retrying
        // cannot help; the host has to join again with a new token.
        if ((e as { code?: number })?.code === 4401) {
          closed = true;
          clearInterval(heartbeat);
          giveUp(`node ${identity.nodeId}: the server refused its credential (${(e as { reason?: string }).reason ?? "4401"}); join again with a new token`);
          return;
        }
        log("spec stream interrupted", { err: String(e) });
      }
      await sleep(Math.min(10_000, 250 * 2 ** attempt));
    }
  })();

  return {
    nodeId: identity.nodeId,
    /** The generation of the last spec fully applied. */
    converged: () => converged,
    /** Settles, with the reason, if the agent gives up for good (its credential was refused). */
    ended,
    async close() {
      closed = true;
      clearInterval(heartbeat);
      await ws.dispose();
      await Promise.race([follow, sleep(1000)]);
      await running;
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
      mkdirSync(opts.stateDir, { recursive: true });
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
