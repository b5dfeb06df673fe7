import { createRequire } from "node:module";
import { defineConfig } from "vitest/config";

export default defineConfig({
  resolve: {
    // graphql 16 ships CJS (`main`) and ESM (`module`) builds. Node, and so Pothos and yoga, load the CJS one;
    // vite would hand our sources the ESM one, and two copies of graphql's classes cannot share a schema.
    alias: [{ find: /^graphql$/, replacement: createRequire(import.meta.url).resolve("graphql") }],
  },
  test: {
    include: ["tests/**/*.test.ts"],
    reporters: ["default", "./tests/support/summary-reporter.ts"],
    globalSetup: ["tests/support/global-setup.ts"],
    pool: "forks",
    // Two cores: more workers only queue on the same CPUs and the same PostgreSQL.
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
