import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Database, openDatabase, withSessionOptions } from "../../infra/db/index.ts";
import { cloneDatabase } from "../support/pg.ts";

// The platform's sessions run without JIT (infra/db/index.ts, SESSION), on both of its pools, and an operator's
// own session options in DATABASE_URL still apply beside it.
let clone: Awaited<ReturnType<typeof cloneDatabase>>;
let db: Database | undefined;
beforeAll(async () => {
  clone = await cloneDatabase();
});
afterAll(async () => {
  await db?.close();
  await clone?.drop();
});

describe("database sessions", () => {
  it("run with JIT off and keep the session options the URL gives", async () => {
    const url = new URL(clone.url);
    url.searchParams.set("options", "-c work_mem=5MB");
    db = await openDatabase({ databaseUrl: url.toString(), poolSize: 1 });
    const show = (sql: { query<T>(text: string): Promise<T[]> }) =>
      sql.query<{ jit: string; work_mem: string }>(`SELECT current_setting('jit') AS jit, current_setting('work_mem') AS work_mem`);
    // Host work's pool (read) and API work's (its own pool, api lane).
    expect(await db.read(show)).toEqual([{ jit: "off", work_mem: "5MB" }]);
    expect(await db.api("sessions test").read(show)).toEqual([{ jit: "off", work_mem: "5MB" }]);
  });

  it("add JIT off to a URL without options, and leave a form only node-postgres reads as it is", () => {
    const plain = withSessionOptions("postgresql://someone@db.internal:5432/bc");
    expect(new URL(plain).searchParams.get("options")).toBe("-c jit=off");
    expect(withSessionOptions("/var/run/postgresql bc")).toBe("/var/run/postgresql bc");
  });
});
