import { hostname } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { startAgent } from "../agent/index.ts";
import { type RuntimeOptions, runtimes } from "../agent/runtimes/registry.ts";
import { AppError } from "../contracts/errors.ts";
import { logger } from "../infra/log.ts";

/** `bc agent`: a host agent. It loads the agent, its runtimes, the contracts and the SDK, nothing of the server. */
export async function agentCommand(args: string[]) {
  const { values } = parseArgs({
    args,
    options: {
      server: { type: "string" },
      "join-token": { type: "string" },
      runtime: { type: "string", default: "fake" },
      name: {
        type: "string",
        default: hostname()
          .toLowerCase()
          .replace(/[^a-z0-9.-]/g, "-"),
      },
      "state-dir": { type: "string" },
      "heartbeat-ms": { type: "string", default: "5000" },
      // What a simulated host offers (the fake runtime); real runtimes read it from the host.
      vcpus: { type: "string", default: "16" },
      "memory-mib": { type: "string", default: "65536" },
      "disk-gib": { type: "string", default: "1000" },
      "delay-ms": { type: "string", default: "0" },
      // libvirt-kvm: the domain type (auto: kvm only with hardware virtualisation), direct kernel boot for
      // root-filesystem images, the shutdown bound, and the GPUs offered (model=0000:65:00.0, repeatable).
      "libvirt-uri": { type: "string" },
      "domain-type": { type: "string" },
      kernel: { type: "string" },
      initrd: { type: "string" },
      cmdline: { type: "string", default: "console=ttyS0 root=/dev/vda rw" },
      "shutdown-timeout-ms": { type: "string" },
      gpu: { type: "string", multiple: true },
    },
  });
  if (!values.server) throw new AppError("INVALID_CONFIG", "bc agent needs --server URL");
  const make = runtimes[values.runtime as string];
  if (!make) throw new AppError("INVALID_CONFIG", `unknown runtime ${values.runtime}; known: ${Object.keys(runtimes).join(", ")}`);
  const stateDir = resolve(values["state-dir"] ?? join(".data", "agent", values.name as string));
  const log = logger((process.env.LOG_LEVEL as "info") ?? "info", { agent: values.name });
  const agent = await startAgent({
    server: values.server,
    joinToken: values["join-token"],
    name: values.name as string,
    stateDir,
    runtime: await make({
      stateDir,
      capacity: { vcpus: Number(values.vcpus), memoryMib: Number(values["memory-mib"]), diskGib: Number(values["disk-gib"]), gpus: [] },
      delayMs: Number(values["delay-ms"]),
      libvirt: libvirtOptions(values),
    }),
    heartbeatMs: Number(values["heartbeat-ms"]),
    log: (m, f) => log.info(m, f),
  });
  process.stdout.write(`agent ${values.name} running as node ${agent.nodeId} (runtime ${values.runtime})\n`);
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

function libvirtOptions(v: Record<string, string | boolean | string[] | undefined>): RuntimeOptions["libvirt"] {
  const domainType = (v["domain-type"] as string | undefined) ?? process.env.LIBVIRT_DOMAIN_TYPE ?? "auto";
  if (!["auto", "kvm", "qemu"].includes(domainType)) throw new AppError("INVALID_CONFIG", `--domain-type must be auto, kvm or qemu, not ${domainType}`);
  const gpus = ((v.gpu as string[] | undefined) ?? []).map((g) => {
    const m = /^([^=]+)=([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$/.exec(g);
    if (!m) throw new AppError("INVALID_CONFIG", `--gpu ${g}: expected model=0000:65:00.0`);
    return { model: m[1] as string, pciAddress: m[2] as string };
  });
  return {
    uri: (v["libvirt-uri"] as string | undefined) ?? process.env.LIBVIRT_URI,
    domainType: domainType as "auto",
    boot: v.kernel
      ? { kernel: resolve(v.kernel as string), initrd: v.initrd ? resolve(v.initrd as string) : undefined, cmdline: v.cmdline as string }
      : undefined,
    shutdownTimeoutMs: v["shutdown-timeout-ms"] ? Number(v["shutdown-timeout-ms"]) : undefined,
    gpus,
  };
}
