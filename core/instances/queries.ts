import { invalid } from "../../contracts/errors.ts";
import { type Principal, requireRead, visibleTo } from "../auth/principal.ts";
import { one, type Sql } from "../kernel/db.ts";
import { type Fragment, SQL } from "../kernel/sql.ts";
import { INSTANCE_COLUMNS, type Instance } from "./model.ts";
import type { InstanceState } from "./state.ts";

/** One instance, or null when the caller cannot see it (another tenant's object does not exist for them). */
export async function getInstance(sql: Sql, who: Principal | null, id: string): Promise<Instance | null> {
  const p = requireRead(who, "compute:instances:read");
  const inst = await one<Instance>(sql, `SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = $1`, [id]);
  return inst && visibleTo(p, inst.tenantId) && (p.operator || !unclaimedWarm(inst)) ? inst : null;
}

/** A warm-pool instance nobody has claimed is the operator's capacity, not yet the tenant's instance. */
const unclaimedWarm = (i: Pick<Instance, "warmTemplateId" | "claimedAt">) => i.warmTemplateId !== null && i.claimedAt === null;

export type Owner = "mine" | "tenant" | "all";

export interface ListArgs {
  poolId?: string | null;
  projectId?: string | null;
  state?: InstanceState | null;
  owner?: Owner | null;
  first?: number | null;
  after?: string | null;
}

export interface InstancePage {
  edges: { cursor: string; node: Instance }[];
  pageInfo: { hasNextPage: boolean; endCursor: string | null };
}

// Newest first; the cursor is the (createdAt, id) of the last row, so pages are stable under inserts.
const encodeCursor = (i: Instance) => Buffer.from(JSON.stringify([i.createdAt.toISOString(), i.id])).toString("base64url");
function decodeCursor(c: string): { at: Date; id: string } {
  try {
    const [at, id] = JSON.parse(Buffer.from(c, "base64url").toString()) as [string, string];
    const d = new Date(at);
    if (typeof id !== "string" || Number.isNaN(d.getTime())) throw new Error();
    return { at: d, id };
  } catch {
    throw invalid("after is not a cursor from this list", { path: "after" });
  }
}

const COLUMNS = SQL.raw(INSTANCE_COLUMNS);

/** A page of the instances the caller can see: by default a tenant's own identity's, an operator's all. */
export async function listInstances(sql: Sql, who: Principal | null, args: ListArgs): Promise<InstancePage> {
  const p = requireRead(who, "compute:instances:read");
  const first = args.first ?? 50;
  if (first < 1 || first > 500) throw invalid("first must be 1 to 500", { path: "first" });
  const owner = args.owner ?? (p.operator ? "all" : "mine");
  if (owner === "all" && !p.operator) throw invalid("owner ALL is for operators", { path: "owner" });
  const where: Fragment[] = [];
  if (!p.operator) where.push(SQL`tenant_id = ${p.tenantId} AND (warm_template_id IS NULL OR claimed_at IS NOT NULL)`);
  if (owner === "mine") where.push(SQL`owner_identity_id = ${p.identityId}`);
  if (args.poolId) where.push(SQL`pool_id = ${args.poolId}`);
  if (args.projectId) where.push(SQL`project_id = ${args.projectId}`);
  if (args.state) where.push(SQL`state = ${args.state}`);
  if (args.after) {
    const c = decodeCursor(args.after);
    where.push(SQL`(created_at, id) < (${c.at}::timestamptz, ${c.id}::text)`);
  }
  const rows = await sql.query<Instance>(
    SQL`SELECT ${COLUMNS} FROM instances ${where.length ? SQL`WHERE ${SQL.join(where, " AND ")}` : SQL.empty}
      ORDER BY created_at DESC, id DESC LIMIT ${first + 1}`,
  );
  const edges = rows.slice(0, first).map((node) => ({ cursor: encodeCursor(node), node }));
  return { edges, pageInfo: { hasNextPage: rows.length > first, endCursor: edges.at(-1)?.cursor ?? null } };
}
