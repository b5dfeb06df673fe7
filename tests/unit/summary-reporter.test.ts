// The closing line of a run (`N passed, N failed`) is what CI and people read: failures outside any test must
// count in it. Planted test files run in a vitest of their own, with the project's summary reporter.
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, expect, it } from "vitest";

const ROOT = resolve(import.meta.dirname, "../..");
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function summaryOf(files: Record<string, string>): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), "bc-summary-"));
  dirs.push(dir);
  symlinkSync(join(ROOT, "node_modules"), join(dir, "node_modules"));
  for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
  writeFileSync(
    join(dir, "vitest.config.mjs"),
    `export default { test: { include: ["*.test.ts"], reporters: [${JSON.stringify(join(ROOT, "tests/support/summary-reporter.ts"))}] } };\n`,
  );
  const run = await promisify(execFile)(process.execPath, [join(ROOT, "node_modules/vitest/vitest.mjs"), "run", "--config", "vitest.config.mjs"], {
    cwd: dir,
  }).catch((e: { stdout: string }) => e);
  return run.stdout.trim().split("\n").at(-1) ?? "";
}

it("counts files that fail to load, hooks that throw and unhandled errors as failures", async () => {
  const summary = await summaryOf({
    "ok.test.ts": `import { it } from "vitest";\nit("a", () => {});\nit("b", () => {});\n`,
    "load.test.ts": `import { it } from "vitest";\nimport { nothing } from "./missing.ts";\nit("c", () => nothing());\n`,
    "hook.test.ts": `import { beforeAll, describe, it } from "vitest";\ndescribe("d", () => {\n  beforeAll(() => { throw new Error("hook"); });\n  it("e", () => {});\n});\n`,
    "late.test.ts": `import { it } from "vitest";\nit("f", () => { setTimeout(() => { throw new Error("late"); }, 1); });\nit("g", () => new Promise((r) => setTimeout(r, 200)));\n`,
  });
  expect(summary).toBe("4 passed, 3 failed, 1 skipped");
}, 60_000);
