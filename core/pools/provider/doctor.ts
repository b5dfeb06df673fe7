import { type Check, type Survey, survey } from "../../books/doctor.ts";
import type { Sql } from "../../kernel/db.ts";

interface FailedAccount {
  id: string;
  name: string;
  provider: string;
  checkError: string;
  checkErrorKind: string | null;
}

/** Provider accounts whose last look (the provider sweep's check) failed. */
function failedAccounts(sql: Sql): Promise<FailedAccount[]> {
  return sql.query<FailedAccount>(
    `SELECT id, name, provider, check_error AS "checkError", check_error_kind AS "checkErrorKind" FROM provider_accounts WHERE check_error IS NOT NULL ORDER BY name`,
  );
}

/** `vps.providers.credentials`: the provider refused the account's credentials. */
const credentialsRefused: Check<FailedAccount> = (a) => {
  if (a.checkErrorKind === "auth")
    return {
      id: "vps.providers.credentials",
      severity: "error",
      subject: a.id,
      message: `provider account ${a.name} (${a.provider}): ${a.checkError}`,
      hint: "replace the account's credentials (deleteProviderAccount, then create it again with working ones)",
    };
  return undefined;
};

/** `vps.providers.unreachable`: the look failed any other way. */
const providerUnreachable: Check<FailedAccount> = (a) => {
  if (a.checkErrorKind !== "auth")
    return {
      id: "vps.providers.unreachable",
      severity: "warning",
      subject: a.id,
      message: `provider account ${a.name} (${a.provider}): ${a.checkError}`,
      hint: "check the provider's status and the account's configuration",
    };
  return undefined;
};

/** The doctor's surveys of provider pools (the provider driver's `doctor`): accounts whose last look failed. */
export const providerChecks: readonly Survey[] = [survey(failedAccounts, [credentialsRefused, providerUnreachable])];
