import { defineConfig } from "vitest/config";

export default defineConfig({
  // One copy of graphql for the whole run: its CJS and ESM builds each define their own classes.
  resolve: { dedupe: ["graphql"] },
  test: {
    include: ["tests/**/*.test.ts"],
    globalSetup: ["tests/support/global-setup.ts"],
    pool: "forks",
    // Two cores: more workers only queue on the same CPUs and the same PostgreSQL.
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
