import { createHash, randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { userInfo } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { migrationsDir } from "../../infra/db/migrate.ts";

/** The PostgreSQL server tests run against; each test gets a database of its own, cloned from a template. */
// The local server trusts local users: connect as the OS user, as psql would.
export const adminUrl = process.env.TEST_DATABASE_URL ?? `postgresql://${encodeURIComponent(userInfo().username)}@127.0.0.1:5432/postgres`;

export const urlFor = (database: string) => {
  const u = new URL(adminUrl);
  u.pathname = `/${database}`;
  return u.toString();
};

/** The template's name follows the migrations, so a changed migration gets a fresh template. */
export function templateName(): string {
  const h = createHash("sha256");
  for (const name of readdirSync(migrationsDir).sort()) {
    if (name.endsWith(".toml")) continue;
    h.update(name).update(readFileSync(join(migrationsDir, name, "migration.sql")));
  }
  return `bc_tpl_${h.digest("hex").slice(0, 16)}`;
}

export async function admin<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: adminUrl });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

export async function databaseExists(name: string): Promise<boolean> {
  return admin(async (c) => (await c.query("SELECT 1 FROM pg_database WHERE datname = $1", [name])).rowCount === 1);
}

export async function createDatabase(name: string, template?: string): Promise<void> {
  await admin(async (c) => {
    for (let attempt = 0; ; attempt++) {
      try {
        await c.query(`CREATE DATABASE "${name}"${template ? ` TEMPLATE "${template}"` : ""}`);
        return;
      } catch (e) {
        // Two clones of one template at the same instant: PostgreSQL refuses the second; try again.
        if (attempt < 20 && /being accessed by other users/.test(String(e))) {
          await new Promise((r) => setTimeout(r, 50 + Math.random() * 100));
          continue;
        }
        throw e;
      }
    }
  });
}

export async function dropDatabase(name: string): Promise<void> {
  await admin((c) => c.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`));
}

/** A fresh, migrated database for one test. */
export async function cloneDatabase(): Promise<{ name: string; url: string; drop(): Promise<void> }> {
  const name = `bc_t_${randomBytes(6).toString("hex")}`;
  await createDatabase(name, templateName());
  return { name, url: urlFor(name), drop: () => dropDatabase(name) };
}
