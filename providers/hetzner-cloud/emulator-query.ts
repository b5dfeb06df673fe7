/**
 * The Hetzner API's conventions the emulator shares across resources: the error envelope, labels and label
 * selectors, `sort=`, and page-based pagination with `meta.pagination` and a `Link` header.
 */

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: unknown = {},
  ) {
    super(message);
  }
  toJSON() {
    return { error: { code: this.code, message: this.message, details: this.details } };
  }
}

export const invalidInput = (field: string, message: string, status = 422) =>
  new ApiError(status, "invalid_input", `invalid input in field '${field}'`, { fields: [{ name: field, messages: [message] }] });

const LABEL_NAME = /^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$/;
const LABEL_VALUE = /^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$/;
const DNS_SUBDOMAIN = /^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*$/;

function labelKeyOk(key: string): boolean {
  const slash = key.lastIndexOf("/");
  const name = slash < 0 ? key : key.slice(slash + 1);
  const prefix = slash < 0 ? null : key.slice(0, slash);
  if (prefix !== null && (!DNS_SUBDOMAIN.test(prefix) || prefix === "hetzner.cloud" || prefix.endsWith(".hetzner.cloud"))) return false;
  return LABEL_NAME.test(name);
}

/** Labels as a request gives them: an object of valid keys to valid string values. */
export function readLabels(raw: unknown): Record<string, string> {
  if (raw === undefined || raw === null) return {};
  if (typeof raw !== "object" || Array.isArray(raw)) throw invalidInput("labels", "must be an object");
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(raw)) {
    if (!labelKeyOk(k)) throw invalidInput("labels", `invalid label key '${k}'`);
    if (typeof v !== "string" || !LABEL_VALUE.test(v)) throw invalidInput("labels", `invalid label value for '${k}'`);
    out[k] = v;
  }
  return out;
}

type LabelTest = (labels: Record<string, string>) => boolean;

/** Splits on the commas that join terms, not those inside `in (a,b)`. */
function terms(selector: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < selector.length; i++) {
    const c = selector[i];
    if (c === "(") depth++;
    else if (c === ")") depth--;
    else if (c === "," && depth === 0) {
      out.push(selector.slice(start, i));
      start = i + 1;
    }
  }
  out.push(selector.slice(start));
  return out.map((t) => t.trim());
}

function term(t: string): LabelTest {
  let m = /^!\s*(\S+)$/.exec(t);
  if (m?.[1] && labelKeyOk(m[1])) {
    const key = m[1];
    return (l) => !(key in l);
  }
  m = /^(\S+)\s+(in|notin)\s+\(([^()]*)\)$/.exec(t);
  if (m?.[1] && m[3] !== undefined && labelKeyOk(m[1])) {
    const [key, negate, values] = [m[1], m[2] === "notin", new Set(m[3].split(",").map((v) => v.trim()))];
    return (l) => (key in l && values.has(l[key] as string)) !== negate;
  }
  m = /^([^=!\s]+)\s*(==|!=|=)\s*(\S*)$/.exec(t);
  if (m?.[1] && m[3] !== undefined && labelKeyOk(m[1]) && LABEL_VALUE.test(m[3])) {
    const [key, negate, value] = [m[1], m[2] === "!=", m[3]];
    return (l) => (l[key] === value) !== negate;
  }
  if (labelKeyOk(t)) return (l) => t in l;
  throw invalidInput("label_selector", `invalid term '${t}'`, 400);
}

/** `k==v`, `k=v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, joined by `,` (all must hold). */
export function labelSelector(selector: string | null): LabelTest {
  if (selector === null || selector.trim() === "") return () => true;
  const tests = terms(selector).map(term);
  return (labels) => tests.every((t) => t(labels));
}

/** `sort=field[:asc|:desc]`, repeatable, applied in order given. */
export function sortBy<T>(items: T[], sorts: string[], fields: Record<string, (x: T) => string | number>): T[] {
  const keys = sorts.map((s) => {
    const [field = "", dir = "asc"] = s.split(":");
    const get = fields[field];
    if (!get || (dir !== "asc" && dir !== "desc")) throw invalidInput("sort", `cannot sort by '${s}'`, 400);
    return { get, sign: dir === "desc" ? -1 : 1 };
  });
  return [...items].sort((a, b) => {
    for (const { get, sign } of keys) {
      const [x, y] = [get(a), get(b)];
      if (x !== y) return (x < y ? -1 : 1) * sign;
    }
    return 0;
  });
}

export interface Page<T> {
  items: T[];
  meta: { pagination: { page: number; per_page: number; previous_page: number | null; next_page: number | null; last_page: number; total_entries: number } };
  link: string;
}

const intParam = (q: URLSearchParams, name: string, fallback: number): number => {
  const raw = q.get(name);
  if (raw === null) return fallback;
  if (!/^\d+$/.test(raw) || Number(raw) < 1) throw invalidInput(name, "must be a positive integer", 400);
  return Number(raw);
};

/** `page` (1-based) and `per_page` (default 25, at most 50: more is cut to 50, as the API does). */
export function paginate<T>(items: T[], url: URL): Page<T> {
  const page = intParam(url.searchParams, "page", 1);
  const perPage = Math.min(50, intParam(url.searchParams, "per_page", 25));
  const last = Math.max(1, Math.ceil(items.length / perPage));
  const pagination = {
    page,
    per_page: perPage,
    previous_page: page > 1 ? Math.min(page - 1, last) : null,
    next_page: page < last ? page + 1 : null,
    last_page: last,
    total_entries: items.length,
  };
  const at = (p: number, rel: string) => {
    const u = new URL(url);
    u.searchParams.set("page", String(p));
    u.searchParams.set("per_page", String(perPage));
    return `<${u}>; rel="${rel}"`;
  };
  const link = [
    pagination.previous_page ? at(pagination.previous_page, "prev") : null,
    pagination.next_page ? at(pagination.next_page, "next") : null,
    at(last, "last"),
  ]
    .filter(Boolean)
    .join(", ");
  return { items: items.slice((page - 1) * perPage, page * perPage), meta: { pagination }, link };
}

/** One request as the routes see it, and what a route answers. */
export interface Request {
  method: string;
  /** The path below `/v1`, e.g. `/servers/42`. */
  path: string;
  url: URL;
  /** The path's captured ids, in order. */
  params: string[];
  body: unknown;
}
export interface Reply {
  status: number;
  body?: unknown;
  link?: string;
}
export type Routes = [RegExp, Partial<Record<string, (req: Request) => Reply>>][];
