import { z } from "zod";
import { type ProviderContext, ProviderError } from "../../core/pools/provider/contract.ts";
import { fail, kindOf, tidy } from "./errors.ts";

export type Query = [string, string][];

export interface CallOptions<T> {
  query?: Query;
  body?: unknown;
  /** Parses the answer; a mismatch is treated as a broken answer (transient), never trusted half-way. */
  schema: z.ZodType<T>;
  /** Answer null instead of failing when Hetzner says 404. */
  missingOk?: boolean;
}

const errorBody = z.object({ error: z.object({ code: z.string().optional(), message: z.string().optional() }) });
const pageMeta = z.object({ pagination: z.object({ next_page: z.number().nullable().optional() }) });

/**
 * Requests to the Hetzner Cloud API with the account's token, classified failures and the rate limit honoured.
 * The token is read per request (so a rotated credential takes effect) and kept out of everything this returns
 * or throws: messages name the method, the path without its query, Hetzner's code and message.
 */
/**
 * A call that finds the budget spent waits its turn for up to this long rather than failing: turns go out in
 * the order calls asked, one per request's refill. Failing at once and trying again later let whoever came
 * back first after a refill win it, and a busy account's sweeps starved its instances (tens of seconds).
 */
const QUEUE_MS = 2000;

export class HcloudHttp {
  private blockedUntil = 0;
  /** How long one request's budget takes to come back, from the last answer that said (ms). */
  private refillMs = 0;
  /** The latest turn handed to a waiting call. */
  private lastTurn = 0;

  constructor(
    private readonly endpoint: string,
    private readonly ctx: ProviderContext,
    private readonly timeoutMs = 15_000,
  ) {}

  pace(): number {
    return Math.max(0, this.blockedUntil - Date.now());
  }

  async call<T>(method: string, path: string, opts: CallOptions<T> & { missingOk: true }): Promise<T | null>;
  async call<T>(method: string, path: string, opts: CallOptions<T>): Promise<T>;
  async call<T>(method: string, path: string, opts: CallOptions<T>): Promise<T | null> {
    const what = `${method} ${path}`;
    // The last answer said the budget is spent: asking anyway would only earn another 429 and delay the refill.
    // A short wait is taken in turn; a long one (an hour's budget spent) fails, to be tried again that much later.
    const now = Date.now();
    const wait = this.blockedUntil <= now && this.lastTurn <= now ? 0 : Math.max(this.blockedUntil, this.lastTurn + this.refillMs) - now;
    if (wait > QUEUE_MS)
      throw fail("transient", what, `rate_limit_exceeded: no request budget left for ${wait} ms`, { code: "rate_limit_exceeded", retryAfterMs: wait });
    if (wait > 0) {
      this.lastTurn = now + wait;
      await new Promise((r) => setTimeout(r, wait));
    }

    const token = await this.token(what);
    const url = this.endpoint + path + (opts.query?.length ? `?${new URLSearchParams(opts.query)}` : "");
    const headers: Record<string, string> = { Authorization: `Bearer ${token}`, Accept: "application/json" };
    if (opts.body !== undefined) headers["Content-Type"] = "application/json";

    let res: Response;
    let text: string;
    try {
      res = await (this.ctx.fetch ?? fetch)(url, {
        method,
        headers,
        body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      this.noteRateLimit(res);
      text = await res.text();
    } catch (e) {
      throw this.networkFailure(what, e);
    }

    let data: unknown;
    let parsed = true;
    try {
      data = text === "" ? undefined : JSON.parse(text);
    } catch {
      parsed = false;
    }

    if (!res.ok) {
      const err = parsed ? errorBody.safeParse(data) : undefined;
      const code = err?.success ? err.data.error.code : undefined;
      const message = err?.success ? (err.data.error.message ?? "") : parsed ? "" : "the answer was not JSON";
      // Only Hetzner's own verdict: a bare 404 from a wrong endpoint must not read as "every server is gone".
      if (res.status === 404 && opts.missingOk && code === "not_found") return null;
      const retryAfterMs = res.status === 429 ? this.retryAfter(res) : undefined;
      const detail = `${code ?? "http_error"} (${res.status})${message ? `: ${tidy(message.split(token).join("[redacted]"))}` : ""}`;
      throw fail(kindOf(code, res.status), what, detail, { code: code ?? String(res.status), retryAfterMs });
    }
    if (!parsed) throw fail("transient", what, `the answer (${res.status}) was not JSON`, { code: String(res.status) });
    const out = opts.schema.safeParse(data);
    if (!out.success) throw fail("transient", what, `the answer (${res.status}) had an unexpected shape`, { code: String(res.status) });
    return out.data;
  }

  /** Every page of a list, following `meta.pagination.next_page` at the largest page size Hetzner allows. */
  async all<T>(path: string, query: Query, key: string, item: z.ZodType<T>): Promise<T[]> {
    const schema = z.preprocess(
      (d) => {
        const o = (d ?? {}) as Record<string, unknown>;
        return { items: o[key], meta: o.meta };
      },
      z.object({ items: z.array(item), meta: pageMeta.optional() }),
    );
    const out: T[] = [];
    for (let page = 1, guard = 0; page > 0 && guard < 10_000; guard++) {
      const answer = await this.call("GET", path, { query: [...query, ["page", String(page)], ["per_page", "50"]], schema });
      out.push(...answer.items);
      page = answer.meta?.pagination.next_page ?? 0;
    }
    return out;
  }

  private async token(what: string): Promise<string> {
    let token: string;
    try {
      token = (await this.ctx.credential("token")).trim();
    } catch (e) {
      if (e instanceof ProviderError) throw e;
      throw fail("auth", what, "the token credential could not be resolved", { code: "credential" });
    }
    // fetch would put an unusable header value, token and all, into its own error message.
    if (!/^[\x21-\x7e]+$/.test(token)) throw fail("auth", what, "the token is empty or holds characters a header cannot carry", { code: "credential" });
    return token;
  }

  private noteRateLimit(res: Response): void {
    const limit = Number(res.headers.get("ratelimit-limit"));
    const remaining = Number(res.headers.get("ratelimit-remaining") ?? Number.NaN);
    const reset = Number(res.headers.get("ratelimit-reset") ?? Number.NaN);
    if (!Number.isFinite(remaining)) return;
    // RateLimit-Reset is when the budget is full again, but Hetzner refills it one request at a time
    // (limit per hour): one request comes back in 1/limit of the time to full, not after the whole of it.
    const untilFull = Number.isFinite(reset) ? Math.max(0, reset * 1000 - Date.now()) : 0;
    if (limit > 0 && remaining < limit) this.refillMs = Math.ceil(untilFull / limit);
    if (remaining > 0 || !Number.isFinite(reset)) {
      this.blockedUntil = 0;
      return;
    }
    this.blockedUntil = Date.now() + Math.ceil(limit > 0 ? untilFull / limit : untilFull);
  }

  private retryAfter(res: Response): number {
    const header = res.headers.get("retry-after");
    let ms = 0;
    if (header !== null) ms = /^\d+$/.test(header.trim()) ? Number(header) * 1000 : Date.parse(header) - Date.now();
    if (!(ms > 0)) ms = this.pace();
    if (!(ms > 0)) ms = 1000;
    this.blockedUntil = Math.max(this.blockedUntil, Date.now() + ms);
    return ms;
  }

  private networkFailure(what: string, e: unknown): ProviderError {
    if (e instanceof ProviderError) return e;
    const name = e instanceof Error ? e.name : "";
    if (name === "TimeoutError" || name === "AbortError") {
      return fail("transient", what, `timeout: no answer within ${this.timeoutMs / 1000} s`, { code: "timeout" });
    }
    // Only the system's error code: fetch's own messages can quote the request.
    const cause = (e as { cause?: { code?: unknown; errors?: { code?: unknown }[] } } | null)?.cause;
    const sysCode = cause?.code ?? cause?.errors?.[0]?.code;
    const code = typeof sysCode === "string" && /^[A-Z0-9_]{1,40}$/.test(sysCode) ? sysCode : "network";
    return fail("transient", what, `network error (${code})`, { code });
  }
}
