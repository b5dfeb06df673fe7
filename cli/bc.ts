import { isAppError } from "../contracts/errors.ts";

const usage = `bc — the Better Compute control plane

  bc dev [--sim N]       the whole platform in one process: server, worker and N simulated hosts; embedded
                         (PGlite under .data/, in-memory pub/sub and jobs) unless DATABASE_URL / REDIS_URL
  bc server              the GraphQL API (HTTP + websocket) and host gateway on PORT; needs SEAL_KEY
  bc worker              the reconcilers and periodic jobs (BullMQ on REDIS_URL); /metrics on METRICS_PORT if set
  bc agent --server URL [--join-token T] [--runtime fake] [--name N] [--state-dir D] [--heartbeat-ms MS]
           [--vcpus N --memory-mib N --disk-gib N] [--delay-ms MS]   (a simulated host: what it offers, how slow)
           [--runtime libvirt-kvm [--domain-type auto|kvm|qemu] [--kernel F --initrd F --cmdline S]
            [--shutdown-timeout-ms MS] [--gpu model=0000:65:00.0 ...] [--libvirt-uri URI]]
                         a host agent: joins once (the credential is kept in the state dir), then converges
  bc login --url U --token T    check and save where the commands below go (flags --url/--token, env
                         BC_URL/BC_TOKEN override it); each takes --json for scripts:
  bc instances list|get|create [--wait]|start|stop|delete|watch    bc sandboxes list|get|create|delete
  bc pools    bc nodes <poolId>    bc usage --from T --to T [--group-by tenant,project,instance]
  bc tokens create --tenant ID --name N | revoke ID    (exit codes: 2 bad input, 3 not found, 4 denied,
                         5 precondition or conflict, 6 quota or capacity, 7 rate limited, 1 anything else)
  bc doctor [--json]     what an operator should fix (pools, hosts, provider accounts, warm pools, the books);
                         asks the server at --url / BC_URL with --token / BC_TOKEN; exits 1 on any error
  bc migrate             apply the committed migrations to DATABASE_URL (or the embedded database)
  bc migrate --create N  write prisma/migrations/<ts>_N from the schema's changes (development)
  bc migrate --check     exit 1 when prisma/schema.prisma has changes no migration holds
  bc schema              print the GraphQL schema (what schema.graphql holds)

Configuration: environment (PORT, HOST, DATABASE_URL, REDIS_URL, REDIS_PREFIX, OPERATOR_TOKEN, SEAL_KEY,
BC_DATA_DIR, VPS_RUNTIMES, PROVIDERS, VPS_HOST_NETWORK, LOG_LEVEL, METRICS_PORT) over an optional compute.config.ts.
`;

/**
 * Each command loads only what it runs: `bc agent` must not pull the server, Prisma, yoga or BullMQ into a
 * host's memory, so commands are imported when chosen.
 */
/** The client's commands (./client.ts), which also take their global flags first: `bc --json instances list`. */
const CLIENT = new Set(["login", "instances", "sandboxes", "pools", "nodes", "usage", "tokens", "doctor"]);

async function main(argv: string[]) {
  const [command, ...rest] = argv;
  if (command?.startsWith("--") && argv.some((a) => CLIENT.has(a))) return (await import("./client.ts")).clientCommand(argv);
  switch (command) {
    case "dev": {
      const { parseArgs } = await import("node:util");
      const { values } = parseArgs({ args: rest, options: { sim: { type: "string", default: "0" } } });
      return (await import("./serve.ts")).serve({ embedded: true, worker: true, sim: Number(values.sim) });
    }
    case "server":
      return (await import("./serve.ts")).serve({ embedded: false, worker: false, sim: 0 });
    case "worker":
      return (await import("./worker.ts")).workerCommand();
    case "agent":
      return (await import("./agent.ts")).agentCommand(rest);
    case "migrate":
      return (await import("./migrate.ts")).migrateCommand(rest);
    case "doctor":
    case "login":
    case "instances":
    case "sandboxes":
    case "pools":
    case "nodes":
    case "usage":
    case "tokens":
      return (await import("./client.ts")).clientCommand(argv);
    case "schema": {
      const { printedSchema } = await import("../server/schema/index.ts");
      process.stdout.write(printedSchema());
      return;
    }
    case undefined:
    case "help":
    case "--help":
      process.stdout.write(usage);
      return;
    default:
      process.stderr.write(`unknown command ${command}\n\n${usage}`);
      process.exitCode = 2;
  }
}

// Whatever any command writes (the embedded database, secrets, an agent's state, seeds with user data) is
// the owner's alone unless a step widens it on purpose; libvirt hands disks to QEMU's user itself.
process.umask(0o077);
main(process.argv.slice(2)).catch((e) => {
  if (isAppError(e)) process.stderr.write(`${e.code}: ${e.message}\n`);
  else process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exit(1);
});
