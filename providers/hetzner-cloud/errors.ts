import { ProviderError, type ProviderErrorKind } from "../../core/pools/provider/contract.ts";

/**
 * Hetzner's error codes by what the reconciler should do about them. Codes not listed fall back to the HTTP
 * status (see `kindOf`), so a code Hetzner adds later still lands somewhere sensible.
 */
const KIND_BY_CODE: Record<string, ProviderErrorKind> = {
  unauthorized: "auth",
  token_readonly: "auth",
  forbidden: "auth",
  resource_limit_exceeded: "quota",
  resource_unavailable: "capacity",
  placement_error: "capacity",
  invalid_input: "invalid",
  json_error: "invalid",
  not_found: "invalid",
  unsupported_error: "invalid",
  invalid_server_type: "invalid",
  uniqueness_error: "invalid",
  method_not_allowed: "invalid",
  deprecated_api_endpoint: "invalid",
  protected: "invalid",
  primary_ip_version_mismatch: "invalid",
  primary_ip_assigned: "invalid",
  primary_ip_datacenter_mismatch: "invalid",
  rate_limit_exceeded: "transient",
  limit_reached: "transient",
  conflict: "transient",
  locked: "transient",
  resource_locked: "transient",
  maintenance: "transient",
  server_error: "transient",
  service_error: "transient",
  unavailable: "transient",
  timeout: "transient",
  bad_gateway: "transient",
  robot_unavailable: "transient",
  unknown_error: "transient",
};

export function kindOf(code: string | undefined, status: number): ProviderErrorKind {
  const known = code ? KIND_BY_CODE[code] : undefined;
  if (known) return known;
  if (status === 401 || (status === 403 && code)) return "auth";
  // A 4xx without a parseable code is most likely a proxy in between, not a verdict on our request.
  if (status >= 400 && status < 500 && code && status !== 409 && status !== 423 && status !== 429) return "invalid";
  return "transient";
}

/** Provider messages are echoed to tenants; keep them one short line. */
export const tidy = (text: string): string => text.replace(/\s+/g, " ").trim().slice(0, 300);

export const fail = (kind: ProviderErrorKind, what: string, detail: string, opts: { code?: string; retryAfterMs?: number } = {}): ProviderError =>
  new ProviderError(kind, `hetzner-cloud: ${what} failed: ${detail}`, opts);
