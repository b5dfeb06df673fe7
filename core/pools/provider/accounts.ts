import { z } from "zod";
import { AppError, invalid, notFound } from "../../../contracts/errors.ts";
import { one, type Sql } from "../../kernel/db.ts";
import { parseInput } from "../../kernel/validation.ts";
import type { Write } from "../../kernel/write.ts";
import type { ProviderDefinition } from "./contract.ts";

/** An account on a provider's cloud: the provider's id and a config it accepts; secrets only as references. */
export interface ProviderAccount {
  id: string;
  name: string;
  provider: string;
  config: Record<string, unknown>;
  createdAt: Date;
}

const COLUMNS = `id, name, provider, config, created_at AS "createdAt"`;

const name = z
  .string()
  .trim()
  .regex(/^[a-z0-9][a-z0-9-]{0,62}$/, "1 to 63 lower-case letters, digits and hyphens");

/** Provider accounts name a provider the deployment lists, with a config that provider accepts. */
export async function createProviderAccount(
  w: Write,
  providers: readonly ProviderDefinition[],
  raw: { name: string; provider: string; config?: unknown },
): Promise<ProviderAccount> {
  const input = parseInput(z.object({ name, provider: z.string(), config: z.unknown() }), raw);
  const def = providers.find((p) => p.id === input.provider);
  if (!def)
    throw invalid(`provider ${input.provider} is not configured; configured: ${providers.map((p) => p.id).join(", ") || "none"}`, { path: "input.provider" });
  const config = parseInput(def.accountConfig, input.config, "input.config");
  if (await one(w.sql, `SELECT 1 FROM provider_accounts WHERE name = $1`, [input.name]))
    throw new AppError("CONFLICT", `provider account ${input.name} exists`);
  const [account] = await w.sql.query<ProviderAccount>(
    `INSERT INTO provider_accounts (id, name, provider, config, created_at) VALUES ($1, $2, $3, $4::jsonb, $5) RETURNING ${COLUMNS}`,
    [w.ids("pacc"), input.name, def.id, JSON.stringify(config), w.now],
  );
  const created = account as ProviderAccount;
  w.audit({ targetId: created.id, details: { provider: def.id } });
  return created;
}

export async function deleteProviderAccount(w: Write, id: string): Promise<ProviderAccount> {
  const account = await one<ProviderAccount & { pools: number }>(
    w.sql,
    `SELECT ${COLUMNS}, (SELECT count(*)::int FROM pools p WHERE p.provider_account_id = a.id) AS pools FROM provider_accounts a WHERE id = $1 FOR UPDATE`,
    [id],
  );
  if (!account) throw notFound("provider account", id);
  const { pools, ...row } = account;
  if (pools > 0) throw new AppError("PRECONDITION_FAILED", `provider account ${row.name} is used by ${pools} pool(s)`);
  await w.sql.query(`DELETE FROM provider_accounts WHERE id = $1`, [id]);
  w.audit({ targetId: id, details: { name: row.name } });
  return row;
}

export async function listProviderAccounts(sql: Sql): Promise<ProviderAccount[]> {
  return sql.query<ProviderAccount>(`SELECT ${COLUMNS} FROM provider_accounts ORDER BY name`);
}
