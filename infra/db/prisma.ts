import type { PGlite } from "@electric-sql/pglite";
import { PrismaPg } from "@prisma/adapter-pg";
import type pg from "pg";
import { PrismaPGlite } from "pglite-prisma-adapter";
import { PrismaClient } from "../../prisma/generated/client.ts";

/**
 * The generated Prisma client, on a database the data layer already opened. Loaded only on request
 * (openDatabase({ prisma: true })): tests and tools inspect rows with it; the platform speaks SQL.
 */
export const prismaOnPg = async (pool: pg.Pool) => new PrismaClient({ adapter: new PrismaPg(pool) });
export const prismaOnPglite = async (lite: PGlite) => new PrismaClient({ adapter: new PrismaPGlite(lite) });
