import type { PrismaClient } from "../../prisma/generated/client.ts";

export { Prisma } from "../../prisma/generated/client.ts";
export type { PrismaClient };
/** A Prisma interactive transaction: every core function that writes takes one. */
export type Tx = Parameters<Parameters<PrismaClient["$transaction"]>[0]>[0];
