import { parseArgs } from "node:util";
import { isAppError } from "../core/errors.ts";
import { openDatabase } from "../infra/db/index.ts";
import { migrate } from "../infra/db/migrate.ts";
import { openPlatform } from "../infra/platform.ts";
import { startServer } from "../server/app.ts";
import { loadConfig } from "./config-file.ts";

const usage = `bc — the Better Compute control plane

  bc dev                 the whole platform in one process; embedded (PGlite under .data/, in-memory
                         pub/sub and jobs) unless DATABASE_URL / REDIS_URL are set
  bc server              the GraphQL API (HTTP + websocket) on PORT; needs SEAL_KEY
  bc migrate             apply the committed migrations to DATABASE_URL (or the embedded database)
  bc migrate --create N  write prisma/migrations/<ts>_N from the schema's changes (development)
  bc migrate --check     exit 1 when prisma/schema.prisma has changes no migration holds
  bc schema              print the GraphQL schema (what schema.graphql holds)

Configuration: environment (PORT, HOST, DATABASE_URL, REDIS_URL, REDIS_PREFIX, OPERATOR_TOKEN, SEAL_KEY,
BC_DATA_DIR, VPS_RUNTIMES, PROVIDERS, VPS_HOST_NETWORK, LOG_LEVEL) over an optional compute.config.ts.
`;

async function main(argv: string[]) {
  const [command, ...rest] = argv;
  switch (command) {
    case "dev":
    case "server":
      return serve(command === "dev");
    case "migrate":
      return migrateCommand(rest);
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

async function serve(embedded: boolean) {
  const config = await loadConfig();
  const platform = await openPlatform(config, { embedded });
  const app = await startServer(platform);
  const mode = config.databaseUrl ? "PostgreSQL" : `PGlite in ${config.dataDir}`;
  const bus = config.redisUrl ? "Redis" : "in-memory pub/sub and jobs";
  process.stdout.write(`Better Compute is up (${mode}; ${bus})\n  GraphQL:  ${app.url}  (GraphiQL in a browser)\n`);
  if (embedded && platform.operatorToken) process.stdout.write(`  Operator: ${platform.operatorToken}\n`);
  const stop = async () => {
    await app.close();
    await platform.close();
    process.exit(0);
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
}

async function migrateCommand(args: string[]) {
  const { values } = parseArgs({ args, options: { create: { type: "string" }, check: { type: "boolean" } } });
  if (values.create || values.check) {
    const { createMigration, diffSql } = await import("../infra/db/migration-tool.ts");
    const paths = { schemaPath: "prisma/schema.prisma", migrationsDir: "prisma/migrations" };
    if (values.create) {
      const made = await createMigration({ ...paths, name: values.create });
      process.stdout.write(made ? `created prisma/migrations/${made}\n` : "no changes\n");
    } else {
      const pending = (await diffSql(paths)).trim();
      if (pending && !/^(--[^\n]*\n?)*$/.test(pending)) {
        process.stdout.write(`prisma/schema.prisma has changes no migration holds:\n${pending}\n`);
        process.exitCode = 1;
      } else process.stdout.write("migrations match the schema\n");
    }
    return;
  }
  const config = await loadConfig();
  const db = await openDatabase({ databaseUrl: config.databaseUrl, dataDir: config.dataDir });
  try {
    const applied = await db.session((sql) => migrate(sql));
    process.stdout.write(applied.length ? `applied ${applied.join(", ")}\n` : "database is up to date\n");
  } finally {
    await db.close();
  }
}

main(process.argv.slice(2)).catch((e) => {
  if (isAppError(e)) process.stderr.write(`${e.code}: ${e.message}\n`);
  else process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exit(1);
});
