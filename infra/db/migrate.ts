import { createHash, randomUUID } from "node:crypto";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { SqlRunner } from "./index.ts";

export const migrationsDir = resolve(fileURLToPath(new URL("../../prisma/migrations", import.meta.url)));

/**
 * Apply the committed migrations, as `prisma migrate deploy` would (same `_prisma_migrations` table, so the
 * Prisma CLI agrees on where a database stands), without the native engine this machine cannot download.
 * An advisory lock lets several processes start at once; an edited, already-applied migration is refused.
 */
export async function migrate(sql: SqlRunner, dir = migrationsDir): Promise<string[]> {
  await sql.exec(`CREATE TABLE IF NOT EXISTS "_prisma_migrations" (
    "id" VARCHAR(36) PRIMARY KEY NOT NULL,
    "checksum" VARCHAR(64) NOT NULL,
    "finished_at" TIMESTAMPTZ,
    "migration_name" VARCHAR(255) NOT NULL,
    "logs" TEXT,
    "rolled_back_at" TIMESTAMPTZ,
    "started_at" TIMESTAMPTZ NOT NULL DEFAULT now(),
    "applied_steps_count" INTEGER NOT NULL DEFAULT 0)`);
  const names = existsSync(dir)
    ? readdirSync(dir, { withFileTypes: true })
        .filter((d) => d.isDirectory())
        .map((d) => d.name)
        .sort()
    : [];
  const applied: string[] = [];
  await sql.exec("SELECT pg_advisory_lock(72707369)");
  try {
    const done = new Map(
      (
        await sql.query<{ migration_name: string; checksum: string }>(
          `SELECT migration_name, checksum FROM "_prisma_migrations" WHERE finished_at IS NOT NULL AND rolled_back_at IS NULL`,
        )
      ).map((r) => [r.migration_name, r.checksum]),
    );
    for (const name of names) {
      const script = readFileSync(join(dir, name, "migration.sql"), "utf8");
      const checksum = createHash("sha256").update(script).digest("hex");
      const seen = done.get(name);
      if (seen !== undefined) {
        if (seen !== checksum) throw new Error(`migration ${name} was edited after it was applied`);
        continue;
      }
      await sql.exec(`BEGIN;\n${script}\n;INSERT INTO "_prisma_migrations" (id, checksum, finished_at, migration_name, applied_steps_count)
        VALUES ('${randomUUID()}', '${checksum}', now(), '${name.replace(/'/g, "''")}', 1);\nCOMMIT;`);
      applied.push(name);
    }
  } catch (e) {
    await sql.exec("ROLLBACK").catch(() => {});
    throw e;
  } finally {
    await sql.exec("SELECT pg_advisory_unlock(72707369)");
  }
  return applied;
}

/** Migrations in `dir` that the database has not applied (for /readyz: a server ahead of its schema is not ready). */
export async function pendingMigrations(sql: Pick<SqlRunner, "query">, dir = migrationsDir): Promise<string[]> {
  const names = existsSync(dir)
    ? readdirSync(dir, { withFileTypes: true })
        .filter((d) => d.isDirectory())
        .map((d) => d.name)
    : [];
  const done = new Set(
    (await sql.query<{ name: string }>(`SELECT migration_name AS name FROM "_prisma_migrations" WHERE finished_at IS NOT NULL AND rolled_back_at IS NULL`)).map(
      (r) => r.name,
    ),
  );
  return names.filter((n) => !done.has(n)).sort();
}
