import { defineConfig } from "prisma/config";

// Prisma 7 reads no .env and throws on a missing env() even for `generate`: fall back to a local default.
export default defineConfig({
  schema: "prisma/schema.prisma",
  migrations: { path: "prisma/migrations" },
  datasource: { url: process.env.DATABASE_URL ?? "postgresql://127.0.0.1:5432/postgres" },
});
