import { z } from "zod";
import { AppError, notFound } from "../../contracts/errors.ts";
import { one, type Sql } from "../kernel/db.ts";
import { displayName, parseInput } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";

/** A tenant's way to group instances; events and lists can be narrowed to one. */
export interface Project {
  id: string;
  tenantId: string;
  name: string;
  createdAt: Date;
}

const COLUMNS = `id, tenant_id AS "tenantId", name, created_at AS "createdAt"`;

export async function createProject(w: Write, tenantId: string, raw: { name: string }): Promise<Project> {
  const input = parseInput(z.object({ name: displayName }), raw);
  if (!(await one(w.sql, `SELECT 1 FROM tenants WHERE id = $1`, [tenantId]))) throw notFound("tenant", tenantId);
  if (await one(w.sql, `SELECT 1 FROM projects WHERE tenant_id = $1 AND name = $2`, [tenantId, input.name]))
    throw new AppError("CONFLICT", `project ${input.name} exists`);
  const [project] = await w.sql.query<Project>(`INSERT INTO projects (id, tenant_id, name, created_at) VALUES ($1, $2, $3, $4) RETURNING ${COLUMNS}`, [
    w.ids("prj"),
    tenantId,
    input.name,
    w.now,
  ]);
  const created = project as Project;
  w.audit({ targetId: created.id, tenantId, details: { name: created.name } });
  return created;
}

/** A tenant's projects, or every tenant's (operators, without a tenant). */
export async function listProjects(sql: Sql, tenantId: string | undefined): Promise<Project[]> {
  return tenantId === undefined
    ? sql.query<Project>(`SELECT ${COLUMNS} FROM projects ORDER BY created_at, id`)
    : sql.query<Project>(`SELECT ${COLUMNS} FROM projects WHERE tenant_id = $1 ORDER BY created_at, id`, [tenantId]);
}
