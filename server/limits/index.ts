import { createHash } from "node:crypto";
import { GraphQLError } from "graphql";
import type { Plugin } from "graphql-yoga";
import type { Config } from "../../infra/config.ts";
import type { Platform } from "../../infra/platform.ts";
import { AuthFailures } from "./auth-failures.ts";
import { documentLimits } from "./document.ts";
import { type LiveLimits, liveLimits } from "./live.ts";
import { openRates } from "./rates.ts";
import { requestLimits } from "./request.ts";

export interface Limits {
  /** For yoga: the document's shape, then the request as it will run. */
  plugins: Plugin[];
  /** For websockets: connections and subscriptions. */
  live: LiveLimits;
  /** Unknown tokens per source address. */
  authFailures: AuthFailures;
  close(): Promise<void>;
}

/** Everything that bounds what one request, and one caller, may cost (docs/architecture.md, Limits). */
export async function openLimits(platform: Platform): Promise<Limits> {
  const { limits } = platform.config;
  const rates = await openRates(platform.config);
  return {
    plugins: [...documentLimits(limits, { dev: platform.dev }), requestLimits(platform, rates) as Plugin],
    live: liveLimits(platform, rates),
    authFailures: new AuthFailures(limits.authFailures, limits.rateWindowSeconds * 1000),
    close: () => rates.close(),
  };
}

/**
 * Where a request's credential is checked: a host's on the host lane; anyone else's as API work, in a turn of
 * its own (keyed by the credential), so a caller flooding the API delays another's check by one statement.
 */
export function credentialChecker(platform: Platform, authorization: string | null): Platform {
  const bearer = /^Bearer\s+(\S+)$/i.exec(authorization ?? "")?.[1];
  if (!bearer || bearer.startsWith("bcn_")) return platform;
  return platform.api(`auth:${createHash("sha256").update(bearer).digest("hex").slice(0, 16)}`);
}

/**
 * A statement of API work cancelled by the statement timeout (SQLSTATE 57014): the request ran longer than the
 * API lane allows. Not the caller's input as such, and nothing was committed: they may retry, or ask for less.
 */
export function overLimit(error: unknown, limits: Config["limits"]): GraphQLError | null {
  const original = (error as { originalError?: unknown }).originalError ?? error;
  if ((original as { code?: unknown })?.code !== "57014") return null;
  const path = (error as { path?: readonly (string | number)[] }).path;
  return new GraphQLError(
    `the request's database work ran longer than ${limits.apiStatementTimeoutMs} ms and was cancelled (the server's limits.apiStatementTimeoutMs); retry later, or ask for less`,
    { path, extensions: { code: "RATE_LIMITED", retryAfterMs: 1000, limit: "apiStatementTimeoutMs" } },
  );
}
