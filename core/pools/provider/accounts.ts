import { z } from "zod";
import { AppError, invalid, notFound } from "../../../contracts/errors.ts";
import { one, type Sql } from "../../kernel/db.ts";
import type { Sealer } from "../../kernel/seal.ts";
import { parseInput, resourceName } from "../../kernel/validation.ts";
import type { Write } from "../../kernel/write.ts";
import type { ProviderDefinition, ProviderOffer } from "./contract.ts";

/**
 * An account on a provider's cloud: the provider's id, a config its schema accepts, and credentials as
 * references. A reference is `env:NAME` or `file:/path`, resolved by the secret broker when the worker needs
 * it, or `sealed:<base64>`, a value given once and sealed on write (bound to the account id). Reads show the
 * references with sealed values as plain `sealed`: no query ever returns a secret.
 */
export interface ProviderAccount {
  id: string;
  name: string;
  provider: string;
  config: Record<string, unknown>;
  credentials: Record<string, string>;
  createdAt: Date;
  /** When the provider sweep last reached the provider with this account, and how that failed (null: it worked). */
  checkedAt: Date | null;
  checkError: string | null;
  checkErrorKind: string | null;
}

const COLUMNS = `id, name, provider, config, credentials, created_at AS "createdAt", checked_at AS "checkedAt", check_error AS "checkError",
  check_error_kind AS "checkErrorKind"`;

/** A reference by scheme, or `{ value }` to seal. The messages never repeat what was given. */
const credential = z.union(
  [
    z.string().regex(/^env:[A-Za-z_][A-Za-z0-9_]{0,127}$/),
    z.string().regex(/^file:\/[^\0]{1,4095}$/),
    z.object({ value: z.string().min(1).max(16_384) }).strict(),
  ],
  { error: 'a reference "env:NAME" or "file:/absolute/path", or { "value": "…" } to seal' },
);

/**
 * The deployment's rules for what an account may name (infra/secret-refs.ts, infra/provider-fetch.ts): each
 * says why a reference or an endpoint URL is refused, or null. The worker applies them again when it calls.
 */
export interface AccountFences {
  reference(ref: string): Promise<string | null>;
  endpoint(url: string): string | null;
}

/** Every string in an account's config that is a URL (an endpoint the worker will call), by its path. */
function urlsIn(value: unknown, path: string): [string, string][] {
  if (typeof value === "string") return /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(value) ? [[path, value]] : [];
  if (typeof value !== "object" || value === null) return [];
  return Object.entries(value).flatMap(([k, v]) => urlsIn(v, `${path}.${k}`));
}

/** What the operator sees of a credential: the reference, or `sealed`. */
export const shownCredentials = (c: Record<string, string>): Record<string, string> =>
  Object.fromEntries(Object.entries(c).map(([k, v]) => [k, v.startsWith("sealed:") ? "sealed" : v]));

/** Provider accounts name a provider the deployment lists, with a config and credentials that provider takes. */
export async function createProviderAccount(
  w: Write,
  deps: { providers: readonly ProviderDefinition[]; sealer: Sealer; fences: AccountFences },
  raw: { name: string; provider: string; config?: unknown; credentials?: unknown },
): Promise<ProviderAccount> {
  const input = parseInput(z.object({ name: resourceName, provider: z.string(), config: z.unknown().optional(), credentials: z.unknown().optional() }), raw);
  const { providers } = deps;
  const def = providers.find((p) => p.id === input.provider);
  if (!def)
    throw invalid(`provider ${input.provider} is not configured; configured: ${providers.map((p) => p.id).join(", ") || "none"}`, {
      path: "input.provider",
    });
  const config = parseInput(def.accountConfig, input.config ?? {}, "input.config");
  const given = parseInput(z.record(z.string(), credential), input.credentials ?? {}, "input.credentials");
  for (const key of Object.keys(given))
    if (!def.credentials.includes(key))
      throw invalid(`input.credentials.${key}: ${def.id} takes ${def.credentials.join(", ") || "no credentials"}`, { path: `input.credentials.${key}` });
  for (const key of def.credentials)
    if (!(key in given)) throw invalid(`input.credentials.${key}: required by ${def.id}`, { path: `input.credentials.${key}` });
  // The messages name the rule, never the reference.
  for (const [key, ref] of Object.entries(given)) {
    const why = typeof ref === "string" ? await deps.fences.reference(ref) : null;
    if (why) throw invalid(`input.credentials.${key}: ${why}`, { path: `input.credentials.${key}` });
  }
  for (const [path, url] of urlsIn(config, "input.config")) {
    const why = deps.fences.endpoint(url);
    if (why) throw invalid(`${path}: ${why}`, { path });
  }
  if (await one(w.sql, `SELECT 1 FROM provider_accounts WHERE name = $1`, [input.name]))
    throw new AppError("CONFLICT", `provider account ${input.name} exists`);
  const id = w.ids("pacc");
  const credentials = Object.fromEntries(
    Object.entries(given).map(([k, v]) => [k, typeof v === "string" ? v : `sealed:${Buffer.from(deps.sealer.seal(v.value, `${id}/${k}`)).toString("base64")}`]),
  );
  const [account] = await w.sql.query<ProviderAccount>(
    `INSERT INTO provider_accounts (id, name, provider, config, credentials, created_at) VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, $6) RETURNING ${COLUMNS}`,
    [id, input.name, def.id, JSON.stringify(config), JSON.stringify(credentials), w.now],
  );
  const created = account as ProviderAccount;
  w.audit({ targetId: created.id, details: { provider: def.id, credentials: shownCredentials(credentials) } });
  w.wakeProviders(created.id);
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

export async function getProviderAccount(sql: Sql, id: string): Promise<ProviderAccount | undefined> {
  return one<ProviderAccount>(sql, `SELECT ${COLUMNS} FROM provider_accounts WHERE id = $1`, [id]);
}

/** The offers as last read from the provider, smallest first. */
export async function offersOf(sql: Sql, accountId: string): Promise<(ProviderOffer & { refreshedAt: Date })[]> {
  return sql.query(
    `SELECT name, vcpus, memory_mib AS "memoryMib", disk_gib AS "diskGib", refreshed_at AS "refreshedAt"
       FROM provider_offers WHERE account_id = $1 ORDER BY vcpus, memory_mib, disk_gib, name`,
    [accountId],
  );
}

/** Replace an account's offers with what the provider said now. Not audited: it records the provider's word. */
export async function storeOffers(sql: Sql, accountId: string, offers: readonly ProviderOffer[], at: Date): Promise<void> {
  await sql.query(`DELETE FROM provider_offers WHERE account_id = $1 AND NOT (name = ANY($2::text[]))`, [accountId, offers.map((o) => o.name)]);
  for (const o of offers)
    await sql.query(
      `INSERT INTO provider_offers (account_id, name, vcpus, memory_mib, disk_gib, refreshed_at) VALUES ($1, $2, $3, $4, $5, $6)
       ON CONFLICT (account_id, name) DO UPDATE SET vcpus = EXCLUDED.vcpus, memory_mib = EXCLUDED.memory_mib, disk_gib = EXCLUDED.disk_gib,
         refreshed_at = EXCLUDED.refreshed_at`,
      [accountId, o.name, o.vcpus, o.memoryMib, o.diskGib, at],
    );
}

/** The smallest offer that holds a shape: fewest vCPUs, then least memory, then least disk. */
export function smallestFitting<O extends ProviderOffer>(offers: readonly O[], shape: { vcpus: number; memoryMib: number; diskGib: number }): O | undefined {
  return [...offers]
    .filter((o) => o.vcpus >= shape.vcpus && o.memoryMib >= shape.memoryMib && o.diskGib >= shape.diskGib)
    .sort((a, b) => a.vcpus - b.vcpus || a.memoryMib - b.memoryMib || a.diskGib - b.diskGib || a.name.localeCompare(b.name))[0];
}

/** What the provider sweep found of the account's connection: null when it worked, else the failure. */
export async function recordAccountCheck(sql: Sql, accountId: string, now: Date, failure: { kind: string; message: string } | null): Promise<void> {
  await sql.query(`UPDATE provider_accounts SET checked_at = $2, check_error = $3, check_error_kind = $4 WHERE id = $1`, [
    accountId,
    now,
    failure?.message.slice(0, 2000) ?? null,
    failure?.kind ?? null,
  ]);
}
