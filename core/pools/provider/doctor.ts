import { type Finding, findings } from "../../books/doctor.ts";
import type { Sql } from "../../kernel/db.ts";

/** The doctor's checks of provider pools (the provider driver's `doctor`): accounts whose last look failed. */
export async function providerChecks(sql: Sql): Promise<Finding[]> {
  const { out, add } = findings();
  const accounts = await sql.query<{ id: string; name: string; provider: string; checkError: string | null; checkErrorKind: string | null }>(
    `SELECT id, name, provider, check_error AS "checkError", check_error_kind AS "checkErrorKind" FROM provider_accounts WHERE check_error IS NOT NULL ORDER BY name`,
  );
  for (const a of accounts) {
    const auth = a.checkErrorKind === "auth";
    add(
      auth ? "vps.providers.credentials" : "vps.providers.unreachable",
      auth ? "error" : "warning",
      a.id,
      `provider account ${a.name} (${a.provider}): ${a.checkError}`,
      auth
        ? "replace the account's credentials (deleteProviderAccount, then create it again with working ones)"
        : "check the provider's status and the account's configuration",
    );
  }
  return out;
}
