// `npm run build`: compile the platform to dist/ and bring along what it reads at run time (the migrations, the
// dashboard's bundle, the SDK's operations whose names /metrics may label series with, the fake host's spawner).
import { execFileSync } from "node:child_process";
import { cpSync, rmSync } from "node:fs";
import { join } from "node:path";

rmSync("dist", { recursive: true, force: true });
execFileSync(join("node_modules", ".bin", "tsc"), ["-p", "tsconfig.build.json"], { stdio: "inherit" });
cpSync("prisma/migrations", "dist/prisma/migrations", { recursive: true });
cpSync("sdk/operations", "dist/sdk/operations", { recursive: true });
cpSync("agent/runtimes/fake/spawner.mjs", "dist/agent/runtimes/fake/spawner.mjs");
execFileSync(process.execPath, ["scripts/build-web.mjs"], { stdio: "inherit" });
cpSync("web/dist", "dist/web/dist", { recursive: true });
console.log("built dist/ — run it with: node dist/cli/bc.js <command>");
