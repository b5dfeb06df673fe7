// `prisma generate` needs no schema engine, but the CLI tries to download one unless this variable names an
// existing file; this machine (and any offline one) has no route to that download.
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const self = fileURLToPath(import.meta.url);
execFileSync("npx", ["prisma", "generate"], {
  stdio: ["ignore", "ignore", "inherit"],
  env: { ...process.env, PRISMA_SCHEMA_ENGINE_BINARY: process.env.PRISMA_SCHEMA_ENGINE_BINARY ?? self, PRISMA_HIDE_UPDATE_MESSAGE: "1" },
});
