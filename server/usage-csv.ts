import type { IncomingMessage, ServerResponse } from "node:http";
import { isAppError } from "../contracts/errors.ts";
import { type Principal, requireRead } from "../core/auth/principal.ts";
import { type UsageGroup, usage, usageCsv } from "../core/books/usage.ts";
import type { Platform } from "../infra/platform.ts";
import { parseDateTime } from "./schema/builder.ts";

const STATUS: Record<string, number> = { UNAUTHENTICATED: 401, FORBIDDEN: 403, NOT_FOUND: 404, INVALID_INPUT: 400 };
const GROUPS = new Set(["tenant", "project", "instance", "meter", "hour", "day"]);

/**
 * `GET /usage.csv?from=…&to=…[&tenantId=…][&groupBy=tenant,project,instance,meter,hour,day]` with the same bearer token
 * and rules as the `usage` query: the same rows, as CSV. Refusals are JSON `{ code, message }` with their status.
 */
export async function serveUsageCsv(platform: Platform, req: IncomingMessage, res: ServerResponse, principal: () => Promise<Principal | null>): Promise<void> {
  const fail = (code: string, message: string) =>
    void res.writeHead(STATUS[code] ?? 500, { "content-type": "application/json" }).end(`${JSON.stringify({ code, message })}\n`);
  try {
    const q = new URL(req.url ?? "/", "http://x").searchParams;
    const who = requireRead(await principal(), "compute:usage:read");
    let from: Date;
    let to: Date;
    try {
      from = parseDateTime(q.get("from"));
      to = parseDateTime(q.get("to"));
    } catch {
      return fail("INVALID_INPUT", "from and to must be RFC 3339 instants, like 2030-01-01T00:00:00Z");
    }
    const groupBy = (q.get("groupBy") ?? "")
      .split(",")
      .filter(Boolean)
      .map((g) => g.toLowerCase());
    const unknown = groupBy.find((g) => !GROUPS.has(g));
    if (unknown) return fail("INVALID_INPUT", `groupBy: ${JSON.stringify(unknown.slice(0, 40))} is not one of tenant, project, instance, meter, hour, day`);
    const rows = await platform.read((sql) => usage(sql, who, { from, to, tenantId: q.get("tenantId"), groupBy: groupBy as UsageGroup[] }));
    res.writeHead(200, { "content-type": "text/csv; charset=utf-8", "content-disposition": 'attachment; filename="usage.csv"' }).end(usageCsv(rows));
  } catch (e) {
    if (isAppError(e)) return fail(e.code, e.message);
    platform.log.error("usage export failed", { err: String(e) });
    return fail("INTERNAL", "the usage export failed");
  }
}
