import { parseArgs } from "node:util";
import { loadConfig } from "../infra/config.ts";
import { openDatabase } from "../infra/db/index.ts";
import { migrate } from "../infra/db/migrate.ts";

/** `bc migrate`: apply, author or check migrations. */
export async function migrateCommand(args: string[]) {
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
