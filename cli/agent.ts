import { loadAgentConfig } from "../agent/config.ts";
import { startAgent } from "../agent/index.ts";
import { Egress } from "../agent/network/egress.ts";
import { runtimes } from "../agent/runtimes/registry.ts";
import { logger } from "../infra/log.ts";

/**
 * `bc agent`: a host agent. It loads the agent, its runtimes, the contracts and the SDK, nothing of the server.
 * Flags and environment are read and validated by agent/config.ts alone.
 */
export async function agentCommand(args: string[]) {
  const config = loadAgentConfig(args);
  const log = logger(config.logLevel, { agent: config.name });
  const make = runtimes[config.runtime];
  if (!make) throw new Error(`runtime ${config.runtime} passed validation but is not registered`);
  // A host that cannot enforce sandboxes' egress policies must say so at start, not run their guests unfiltered.
  if (config.egress === "nftables" && !(await Egress.available()))
    throw new Error("--egress nftables needs nft (the nftables package) and CAP_NET_ADMIN; install it, or run with --egress off");
  const agent = await startAgent({
    server: config.server,
    joinToken: config.joinToken,
    name: config.name,
    stateDir: config.stateDir,
    runtime: await make(config.runtimeOptions),
    heartbeatMs: config.heartbeatMs,
    ...(config.egress === "nftables" ? { egress: new Egress() } : {}),
    log: (m, f) => log.info(m, f),
  });
  process.stdout.write(`agent ${config.name} running as node ${agent.nodeId} (runtime ${config.runtime})\n`);
  void agent.ended.then(async (why) => {
    log.error("agent stopped", { why });
    await agent.close();
    process.exit(1);
  });
  const stop = async () => {
    await agent.close();
    process.exit(0);
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
}
