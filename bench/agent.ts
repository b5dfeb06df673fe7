/**
 * The host agent's idle resident memory, as deployed (the compiled build) and from the sources.
 *
 *   npm run bench:agent -- [--compiled 1] [--settle-ms 3000]
 *
 * Starts an embedded `bc dev` (no simulated hosts) as the server, joins one `bc agent --runtime fake` to a
 * hosted pool, waits until it has reported and gone quiet, then samples its RSS. Prints it next to the RSS
 * of a bare Node process that does nothing (this machine's floor) and the goal (≤ 100 MiB compiled).
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { benchArgs, exitWhenDone, rssOf } from "./lib.ts";

const args = benchArgs({ compiled: 1, "settle-ms": 3000 });
const mib = (b: number) => (b / 2 ** 20).toFixed(1);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function start(cmd: string[], env: NodeJS.ProcessEnv): { child: ChildProcess; out: () => string } {
  const child = spawn(process.execPath, cmd, { env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout?.on("data", (d) => (out += d));
  child.stderr?.on("data", (d) => (out += d));
  return { child, out: () => out };
}

async function waitFor(what: string, p: { child: ChildProcess; out: () => string }, re: RegExp, ms = 60_000): Promise<RegExpExecArray> {
  for (const end = Date.now() + ms; ; ) {
    const m = re.exec(p.out());
    if (m) return m;
    if (p.child.exitCode !== null || Date.now() > end) throw new Error(`${what} did not print ${re}:\n${p.out()}`);
    await sleep(50);
  }
}

async function gql(url: string, token: string, query: string, variables: Record<string, unknown> = {}) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
    body: JSON.stringify({ query, variables }),
  });
  const body = (await res.json()) as { data?: Record<string, unknown>; errors?: unknown[] };
  if (body.errors?.length) throw new Error(JSON.stringify(body.errors));
  return body.data as Record<string, Record<string, unknown>>;
}

/** Sampled several times over a second: the largest reading, so a GC between samples does not flatter it. */
async function steadyRss(pid: number): Promise<number> {
  let max = 0;
  for (let i = 0; i < 10; i++) {
    max = Math.max(max, rssOf(pid));
    await sleep(100);
  }
  return max;
}

async function run() {
  if (args.compiled) execFileSync(process.execPath, ["scripts/build.mjs"], { stdio: "ignore" });
  const entry = args.compiled ? "dist/cli/bc.js" : "bin/bc.mjs";
  const dir = mkdtempSync(join(tmpdir(), "bc-agent-bench-"));
  // Embedded: the server needs no PostgreSQL or Redis of its own for this.
  const env: NodeJS.ProcessEnv = { ...process.env, BC_DATA_DIR: join(dir, "server"), PORT: "0", LOG_LEVEL: "warn" };
  delete env.DATABASE_URL;
  delete env.REDIS_URL;
  const server = start([entry, "dev"], env);
  let agent: ReturnType<typeof start> | undefined;
  const bare = start(["-e", "setInterval(() => {}, 1000)"], env);
  try {
    const url = (await waitFor("bc dev", server, /GraphQL:\s+(\S+)/))[1] as string;
    const token = (await waitFor("bc dev", server, /Operator:\s+(\S+)/))[1] as string;
    const pool = (await gql(url, token, `mutation { createPool(input: {name: "bench", class: VPS_HOST, ipv4Range: "10.99.0.0/24"}) { id } }`)).createPool;
    const join_ = (await gql(url, token, `mutation($p: ID!) { createJoinToken(poolId: $p) { token } }`, { p: pool?.id })).createJoinToken;
    agent = start(
      [entry, "agent", "--server", url, "--join-token", String(join_?.token), "--runtime", "fake", "--name", "bench-1", "--state-dir", join(dir, "agent")],
      env,
    );
    await waitFor("bc agent", agent, /running as node/);
    // Idle: it has reported its capacity, received its (empty) spec and has nothing to do but heartbeats.
    for (const end = Date.now() + 30_000; ; await sleep(100)) {
      const nodes = (await gql(url, token, `query($p: ID!) { nodes(poolId: $p) { capacity { vcpus } } }`, { p: pool?.id })).nodes as unknown as {
        capacity: { vcpus: number };
      }[];
      if (nodes[0]?.capacity.vcpus) break;
      if (Date.now() > end) throw new Error("the agent never reported");
    }
    await sleep(args["settle-ms"]);
    const agentRss = await steadyRss(agent.child.pid as number);
    const bareRss = await steadyRss(bare.child.pid as number);
    console.log(`agent idle RSS (${args.compiled ? "compiled" : "sources through tsx"}): ${mib(agentRss)} MiB`);
    console.log(`bare node process RSS:                 ${mib(bareRss)} MiB  (ratio ${(agentRss / bareRss).toFixed(2)})`);
    if (args.compiled) console.log(`goal: ≤ 100 MiB — ${agentRss <= 100 * 2 ** 20 ? "met" : "NOT met"}`);
  } finally {
    for (const p of [agent, server, bare]) p?.child.kill("SIGTERM");
    await sleep(500);
    rmSync(dir, { recursive: true, force: true });
  }
}

exitWhenDone(run());
