import { type ProviderContext, ProviderError, type ProviderErrorKind } from "../../core/pools/provider/contract.ts";

/**
 * The request layer: API-token auth, form bodies, the `{data}` envelope, and PVE's errors turned into
 * ProviderErrors. PVE puts its error text in the HTTP reason phrase (newer versions also in `message`), and
 * parameter errors in `errors`. The token secret is read per request and kept out of every message.
 */

export interface Tuning {
  /** Per request; a request that takes longer is transient. */
  requestTimeoutMs?: number;
  /** How long create waits for a clone, config or resize task. */
  taskTimeoutMs?: number;
  /** The first wait between task polls; it grows by half each time, up to 2 s. */
  pollMs?: number;
}

/** A ProviderError that keeps PVE's own text, so callers can tell "already exists" from "does not exist". */
export class PveError extends ProviderError {
  readonly reason: string;
  constructor(kind: ProviderErrorKind, message: string, reason: string, opts: { code?: string; retryAfterMs?: number } = {}) {
    super(kind, message, opts);
    this.reason = reason;
  }
}

export const reasonOf = (e: unknown): string => (e instanceof PveError ? e.reason : "");

/** A clone's new VMID was taken by someone else between nextid and the clone. */
export const vmidTaken = (e: unknown) => /already exists/i.test(reasonOf(e));
/** PVE's answer for a VM (or task) it does not know. */
export const missing = (e: unknown) => /does not exist|no such (task|vm)/i.test(reasonOf(e));

/** What PVE's text says went wrong; the default for a plain 500 is transient. */
export function classify(text: string): ProviderErrorKind {
  if (/already exists/i.test(text)) return "transient";
  if (/not enough|no space|out of memory|cannot allocate memory|insufficient|is full|storage .*full/i.test(text)) return "capacity";
  if (/quota/i.test(text)) return "quota";
  if (/locked|timeout|timed out|temporar|try again|got no worker/i.test(text)) return "transient";
  if (/does not exist|not allowed|invalid|unable to parse|no such|not defined in schema|hostname lookup|shrinking|template/i.test(text)) return "invalid";
  return "transient";
}

function kindOf(status: number, reason: string): ProviderErrorKind {
  if (status === 401 || status === 403) return "auth";
  if (status === 429) return "transient";
  if (status === 500) return classify(reason);
  if (status >= 400 && status < 500) return "invalid";
  if (status === 501) return "invalid";
  return "transient";
}

function retryAfter(header: string | null): number {
  if (header) {
    const seconds = Number(header);
    if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
    const at = Date.parse(header);
    if (Number.isFinite(at)) return Math.max(0, at - Date.now());
  }
  return 1000;
}

export type Params = Record<string, string | number | undefined>;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class PveApi {
  private readonly base: string;
  private blockedUntil = 0;
  readonly timeoutMs: number;
  readonly taskTimeoutMs: number;
  readonly pollMs: number;

  constructor(
    endpoint: string,
    private readonly tokenId: string,
    private readonly ctx: ProviderContext,
    tuning: Tuning = {},
  ) {
    this.base = endpoint.replace(/\/+$/, "");
    this.timeoutMs = tuning.requestTimeoutMs ?? 15_000;
    this.taskTimeoutMs = tuning.taskTimeoutMs ?? 600_000;
    this.pollMs = tuning.pollMs ?? 50;
  }

  pace(): number {
    return Math.max(0, this.blockedUntil - Date.now());
  }

  get = <T>(path: string, params?: Params) => this.call<T>("GET", path, params);
  post = <T>(path: string, params?: Params) => this.call<T>("POST", path, params);
  put = <T>(path: string, params?: Params) => this.call<T>("PUT", path, params);
  del = <T>(path: string, params?: Params) => this.call<T>("DELETE", path, params);

  async call<T>(method: string, path: string, params: Params = {}): Promise<T> {
    const what = `${method} ${path}`;
    const wait = this.pace();
    if (wait > 0)
      throw new PveError("transient", `proxmox-ve: ${what} held back: rate limited for ${wait} ms more`, "rate limited", { code: "429", retryAfterMs: wait });
    const secret = await this.secret();
    const scrub = (s: string) => s.split(secret).join("***").slice(0, 500);
    const form = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== undefined) form.set(k, String(v));
    const hasBody = method === "POST" || method === "PUT";
    const query = !hasBody && [...form.keys()].length ? `?${form}` : "";
    let res: Response;
    let text: string;
    let body: { data?: unknown; message?: unknown; errors?: unknown } | undefined;
    try {
      res = await (this.ctx.fetch ?? fetch)(this.base + path + query, {
        method,
        headers: {
          Authorization: `PVEAPIToken=${this.tokenId}=${secret}`,
          Accept: "application/json",
          ...(hasBody ? { "Content-Type": "application/x-www-form-urlencoded" } : {}),
        },
        body: hasBody ? form.toString() : undefined,
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      text = await res.text();
    } catch (e) {
      // The deployment's fetch refused the endpoint (infra/provider-fetch.ts): its verdict stands.
      if (e instanceof ProviderError) throw e;
      // Node's fetch errors name the URL and cause, never our headers; still, only their kind is passed on.
      const name = e instanceof Error ? e.name : "error";
      const why = name === "TimeoutError" || name === "AbortError" ? `no answer within ${this.timeoutMs} ms` : `network error (${causeCode(e)})`;
      throw new PveError("transient", `proxmox-ve: ${what} failed: ${why}`, why, { code: "network" });
    }
    try {
      body = text ? JSON.parse(text) : undefined;
    } catch {
      // A proxy's error page is not JSON; its status still says what happened.
      if (res.ok) throw new PveError("transient", `proxmox-ve: ${what} failed: the answer was not JSON`, "not JSON", { code: String(res.status) });
    }
    if (res.ok) return (body?.data ?? null) as T;
    const reason = scrub(reasonText(res.statusText, body));
    const opts: { code: string; retryAfterMs?: number } = { code: String(res.status) };
    if (res.status === 429) {
      opts.retryAfterMs = retryAfter(res.headers.get("retry-after"));
      this.blockedUntil = Date.now() + opts.retryAfterMs;
    }
    throw new PveError(kindOf(res.status, reason), `proxmox-ve: ${what} failed (${res.status}): ${reason}`, reason, opts);
  }

  /** Waits for a task (clone, config, resize, stop) to stop; a task that failed throws, classified by its exit text. */
  async waitTask(upid: string): Promise<void> {
    const node = upid.split(":")[1] ?? "";
    const path = `/nodes/${encodeURIComponent(node)}/tasks/${encodeURIComponent(upid)}/status`;
    const type = upid.split(":")[5] ?? "task";
    const id = upid.split(":")[6] ?? "";
    const deadline = Date.now() + this.taskTimeoutMs;
    let delay = this.pollMs;
    let failures = 0;
    while (Date.now() < deadline) {
      await sleep(delay);
      delay = Math.min(delay * 1.5, 2000);
      let task: { status?: string; exitstatus?: string } | null;
      try {
        task = await this.get(path);
        failures = 0;
      } catch (e) {
        // A poll that failed says nothing of the task: look again, unless PVE keeps refusing.
        if (!(e instanceof ProviderError) || e.kind !== "transient" || ++failures > 5) throw e;
        if (e.retryAfterMs) await sleep(Math.min(e.retryAfterMs, Math.max(0, deadline - Date.now())));
        continue;
      }
      if (task?.status !== "stopped") continue;
      const exit = String(task.exitstatus ?? "unexpected status");
      if (exit === "OK" || exit.startsWith("WARNINGS")) return;
      throw new PveError(classify(exit), `proxmox-ve: task ${type}:${id} failed: ${exit.slice(0, 300)}`, exit, { code: "task" });
    }
    throw new PveError("transient", `proxmox-ve: task ${type}:${id} still running after ${this.taskTimeoutMs} ms`, "timeout", { code: "task" });
  }

  private async secret(): Promise<string> {
    let secret: string;
    try {
      secret = (await this.ctx.credential("tokenSecret")).trim();
    } catch {
      throw new PveError("auth", "proxmox-ve: the account's tokenSecret could not be read", "credential");
    }
    // A header value with control characters makes fetch throw a message that quotes the whole header.
    if (!/^[\x21-\x7e]+$/.test(secret))
      throw new PveError("auth", "proxmox-ve: the account's tokenSecret is empty or has characters a header cannot carry", "credential");
    return secret;
  }
}

function reasonText(statusText: string, body: { message?: unknown; errors?: unknown } | undefined): string {
  const message = typeof body?.message === "string" ? body.message.trim() : "";
  let reason = message || statusText.trim() || "no reason given";
  const errors = body?.errors;
  if (errors && typeof errors === "object") {
    const list = Object.entries(errors).map(([k, v]) => `${k}: ${String(v).trim()}`);
    if (list.length) reason += ` (${list.join("; ")})`;
  }
  return reason;
}

function causeCode(e: unknown): string {
  const cause = e instanceof Error ? (e.cause as { code?: unknown } | undefined) : undefined;
  return typeof cause?.code === "string" ? cause.code : "unreachable";
}
