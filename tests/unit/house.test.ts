// The house rules: who may import whom (.dependency-cruiser.mjs), where process.env may be read (biome's
// noProcessEnv, with its exceptions in biome.json), and that the tree type-checks and passes biome.
//
// Each rule is checked twice: on the repository, where it must hold, and on a small tree planted in a temp directory,
// where it must fire exactly where a violation was planted. The second half proves the rules can fail.
import { execFile } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import type { ICruiseOptions, ICruiseResult, IForbiddenRuleType, IViolation } from "dependency-cruiser";
import { cruise } from "dependency-cruiser";
import { afterAll, describe, expect, it } from "vitest";

const ROOT = resolve(import.meta.dirname, "../..");
const BIN = join(ROOT, "node_modules/.bin");

// The rules themselves, from the one config file that `npm run deps` uses too (a .mjs: imported by URL so tsc, which
// does not read JavaScript here, takes the shape below on trust).
const house = (await import(pathToFileURL(join(ROOT, ".dependency-cruiser.mjs")).href)) as {
  forbidden: IForbiddenRuleType[];
  options: ICruiseOptions;
};

const temps: string[] = [];
afterAll(() => {
  for (const dir of temps) rmSync(dir, { recursive: true, force: true });
});

/** A throwaway tree: `files` maps paths (relative to its root) to contents. */
function plant(files: Record<string, string>): string {
  const dir = mkdtempSync(join(tmpdir(), "bc-house-"));
  temps.push(dir);
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, path)), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
  return dir;
}

/** A violation as compared in the tests; a cycle lists its hops, "(type-only)" marking those reached by `import type`. */
interface Found {
  rule: string;
  from: string;
  to: string;
  typeOnly: boolean;
  cycle?: string[];
}

const hop = (h: { name: string; dependencyTypes: string[] }) => `${h.name}${h.dependencyTypes.includes("type-only") ? " (type-only)" : ""}`;

function found(v: IViolation): Found {
  const typeOnly = v.dependencyTypes?.includes("type-only") ?? false;
  return { rule: v.rule.name, from: v.from, to: v.to, typeOnly, ...(v.cycle ? { cycle: v.cycle.map(hop) } : {}) };
}

/** `rule: from → to` (a cycle spelled out hop by hop), for failure messages. */
function line(v: IViolation): string {
  if (v.cycle) return `  ${v.rule.name}: ${[v.from, ...v.cycle.map(hop)].join(" → ")}`;
  return `  ${v.rule.name}: ${v.from} → ${v.to}${v.dependencyTypes?.includes("type-only") ? " (type-only)" : ""}`;
}

/** Cruises `baseDir` (all of it) with the house rules and options, as `npm run deps` does. */
async function cruiseTree(baseDir: string): Promise<ICruiseResult> {
  const result = await cruise(
    ["."],
    { ...house.options, baseDir, tsConfig: { fileName: join(baseDir, "tsconfig.json") }, validate: true, ruleSet: { forbidden: house.forbidden } },
    {},
    {},
  );
  if (typeof result.output === "string") throw new Error("expected a cruise result, got a report");
  return result.output;
}

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs a tool from node_modules/.bin; resolves with its exit code and output whatever the code (bounded in time). */
function run(command: string, args: string[], cwd: string, timeoutMs: number): Promise<Run> {
  return new Promise((done, fail) => {
    execFile(join(BIN, command), args, { cwd, timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error && typeof error.code !== "number") return fail(new Error(`${command} ${args.join(" ")}: ${error.message}\n${stderr}`));
      done({ code: typeof error?.code === "number" ? error.code : 0, stdout, stderr });
    });
  });
}

interface BiomeDiagnostic {
  severity: string;
  category?: string;
  message: string;
  location?: { path?: string; start?: { line: number; column: number } };
}

/** Where `biome lint` (with the biome.json in `cwd`) reports process.env. */
async function processEnvReads(cwd: string): Promise<string[]> {
  const { stdout, stderr } = await run("biome", ["lint", "--reporter=json", "--max-diagnostics=none", "."], cwd, 60_000);
  let report: { diagnostics: BiomeDiagnostic[] };
  try {
    report = JSON.parse(stdout);
  } catch {
    throw new Error(`biome lint did not print a JSON report:\n${stdout}\n${stderr}`);
  }
  // Not `--only=style/noProcessEnv`: that switches the rule back on (at "info") in the files biome.json exempts.
  return report.diagnostics
    .filter((d) => d.category === "lint/style/noProcessEnv" && d.severity === "error")
    .map((d) => `${d.location?.path}:${d.location?.start?.line ?? "?"}`);
}

describe("house rules", () => {
  it("the dependency rules hold", { timeout: 60_000 }, async () => {
    const result = await cruiseTree(ROOT);
    const violations = result.summary.violations;
    const message = `${violations.length} dependency rule violation(s) (rules and reasons in .dependency-cruiser.mjs):\n${violations.map(line).join("\n")}`;
    expect(violations.map(found), message).toEqual([]);
    // The cruise saw the tree, not an empty folder.
    expect(result.modules.filter((m) => m.source.startsWith("core/")).length).toBeGreaterThan(10);
  });

  it("the rules catch a planted cycle and each forbidden direction", { timeout: 60_000 }, async () => {
    const ts = (...imports: string[]) => `${imports.join("\n")}\nexport const here = 1;\n`;
    const dir = plant({
      "tsconfig.json": "{}\n",
      "node_modules/some-pkg/package.json": JSON.stringify({ name: "some-pkg", version: "1.0.0", main: "index.js" }),
      "node_modules/some-pkg/index.js": "export const pkg = 1;\n",

      // contracts: only itself, builtins and npm packages; then one import of ours.
      "contracts/ok.ts": ts(`import { createHash } from "node:crypto";`, `import { pkg } from "some-pkg";`, `import "./other.ts";`),
      "contracts/other.ts": ts(),
      "contracts/bad.ts": ts(`import "../core/k.ts";`),

      // core: a cycle, one edge of it type-only; core → contracts is fine; core → server and a type from infra are not.
      "core/a.ts": ts(`import "./b.ts";`, `import "../contracts/ok.ts";`),
      "core/b.ts": ts(`import type { here } from "./a.ts";`),
      "core/c.ts": ts(`import "../server/x.ts";`, `import type { here } from "../infra/q.ts";`),
      "core/k.ts": ts(),
      "core/broken.ts": ts(`import "./missing.ts";`),

      // core's folders, inner to outer (kernel, auth, tenancy, catalog, books, instances, commands, pools, pools/<class>,
      // lifecycle, sandboxes, teardown, then core's root): one import the wrong way from each. The planted wrong ways
      // all point outward, and the allowed ones below close no loop, so only the pair planted for it makes a folder cycle.
      "core/kernel/db.ts": ts(),
      "core/kernel/bad.ts": ts(`import "../auth/who.ts";`),
      "core/auth/who.ts": ts(),
      "core/auth/bad.ts": ts(`import type { here } from "../tenancy/q.ts";`),
      "core/tenancy/q.ts": ts(),
      "core/tenancy/bad.ts": ts(`import "../catalog/f.ts";`),
      "core/catalog/f.ts": ts(),
      "core/catalog/bad.ts": ts(`import "../books/s.ts";`),
      "core/books/s.ts": ts(),
      "core/books/bad.ts": ts(`import "../instances/m.ts";`),
      "core/instances/m.ts": ts(),
      "core/instances/bad.ts": ts(`import "../pools/registry.ts";`),
      "core/commands/c.ts": ts(`import "../instances/m.ts";`),
      "core/commands/bad.ts": ts(`import "../pools/pools.ts";`),
      // The seam, and a class on it; the seam may not import a class, nor a class another, nor pools the operations.
      "core/pools/driver.ts": ts(),
      "core/pools/registry.ts": ts(`import "./driver.ts";`),
      "core/pools/pools.ts": ts(`import "./registry.ts";`),
      "core/pools/bad.ts": ts(`import "./hosted/driver.ts";`),
      "core/pools/hosted/driver.ts": ts(`import "../driver.ts";`, `import "./impl.ts";`),
      "core/pools/hosted/impl.ts": ts(),
      "core/pools/hosted/bad.ts": ts(`import "../provider/driver.ts";`),
      "core/pools/provider/driver.ts": ts(`import "../registry.ts";`),
      "core/pools/provider/bad.ts": ts(`import "../../sandboxes/sb.ts";`),
      // Operations reach pool classes through the seam only; the inner folders are theirs to use.
      "core/lifecycle/ops.ts": ts(
        `import "../pools/driver.ts";`,
        `import "../pools/registry.ts";`,
        `import "../pools/pools.ts";`,
        `import "../instances/m.ts";`,
        `import "../commands/c.ts";`,
        `import "../kernel/db.ts";`,
      ),
      "core/lifecycle/classes.ts": ts(`import "../pools/hosted/impl.ts";`),
      "core/lifecycle/bad.ts": ts(`import "../sandboxes/sb.ts";`),
      "core/sandboxes/sb.ts": ts(),
      "core/sandboxes/bad.ts": ts(`import "../teardown/t.ts";`),
      "core/teardown/t.ts": ts(),
      "core/teardown/bad.ts": ts(`import "../drivers.ts";`),
      // core's root registers the drivers: it may import a class's folder, and no folder may import it.
      "core/drivers.ts": ts(`import "./pools/hosted/driver.ts";`, `import "./pools/provider/driver.ts";`, `import "./pools/registry.ts";`),
      // Two folders no direction rule names, each importing the other (different files: no module cycle).
      "core/left/a.ts": ts(`import "../right/b.ts";`),
      "core/right/c.ts": ts(`import "../left/d.ts";`),
      "core/right/b.ts": ts(),
      "core/left/d.ts": ts(),

      // providers: the registry may import every plugin; a plugin its own folder, contracts/ and core/ only.
      "providers/index.ts": ts(`import "./p1/index.ts";`, `import "./p2/index.ts";`),
      "providers/p1/index.ts": ts(`import "./impl.ts";`, `import "../../core/k.ts";`, `import "../../infra/q.ts";`, `import "../p2/index.ts";`),
      "providers/p1/impl.ts": ts(`import "../../contracts/ok.ts";`),
      "providers/p2/index.ts": ts(),

      // infra: core/, contracts/, providers/ and its data layer (which alone may use the Prisma client); not server/.
      "infra/q.ts": ts(),
      "infra/ok.ts": ts(`import "../core/k.ts";`, `import "../contracts/ok.ts";`, `import "../providers/index.ts";`, `import "./db/store.ts";`),
      "infra/db/store.ts": ts(`import "../../prisma/generated/client.ts";`),
      "infra/bad.ts": ts(`import "../server/s.ts";`),

      // server and worker: core/, contracts/, infra/, never each other; the server not the Prisma client either.
      "server/s.ts": ts(`import "../core/k.ts";`, `import "../infra/q.ts";`),
      "server/x.ts": ts(`import "../worker/w.ts";`),
      "server/rows.ts": ts(`import type { here } from "../prisma/generated/client.ts";`),
      "worker/w.ts": ts(`import "../infra/q.ts";`),
      "worker/w2.ts": ts(`import "../server/s.ts";`),

      // agent: contracts/ and sdk/ only. sdk: contracts/ only (a type from core/ counts).
      "agent/ok.ts": ts(`import "../sdk/ok.ts";`, `import "../contracts/ok.ts";`),
      "agent/y.ts": ts(`import "../core/a.ts";`),
      "sdk/ok.ts": ts(`import "../contracts/ok.ts";`),
      "sdk/z.ts": ts(`import "../infra/q.ts";`),
      "sdk/t.ts": ts(`import type { here } from "../core/k.ts";`),

      // web (the dashboard): sdk/ only.
      "web/ok.ts": ts(`import "../sdk/ok.ts";`, `import "./view.ts";`),
      "web/view.ts": ts(),
      "web/bad.ts": ts(`import "../contracts/ok.ts";`),

      // cli may import anything but the Prisma client.
      "cli/run.ts": ts(`import "../server/s.ts";`, `import "../worker/w.ts";`, `import "../agent/ok.ts";`, `import "../infra/ok.ts";`),
      "cli/db.ts": ts(`import "../prisma/generated/client.ts";`),

      // Exempt from the direction rules (tests/ and bench/ may use the Prisma client), not from the cycle rule.
      "tests/t.test.ts": ts(`import "../server/x.ts";`, `import "../prisma/generated/client.ts";`, `import "./h1.ts";`),
      "tests/h1.ts": ts(`import "./h2.ts";`),
      "tests/h2.ts": ts(`import "./h1.ts";`),
      "bench/b.ts": ts(`import "../prisma/generated/client.ts";`, `import "../worker/w.ts";`),
      "scripts/s.ts": ts(`import "../server/s.ts";`),
      "examples/e.ts": ts(`import "../sdk/z.ts";`, `import "../core/k.ts";`),
      "vitest.config.ts": ts(`import "./tests/h1.ts";`),

      // Not cruised as sources: the Prisma client's internals and build output (a cycle in each would otherwise show).
      "prisma/generated/client.ts": ts(`import "./internal/class.ts";`),
      "prisma/generated/internal/class.ts": ts(`import "../client.ts";`, `import "../../../server/s.ts";`),
      "dist/one.js": `import "./two.js";\n`,
      "dist/two.js": `import "./one.js";\n`,
    });

    const result = await cruiseTree(dir);
    const got = result.summary.violations.map(found);
    const sorted = (list: Found[]) => [...list].sort((x, y) => `${x.rule} ${x.from} ${x.to}`.localeCompare(`${y.rule} ${y.from} ${y.to}`));
    const v = (rule: string, from: string, to: string, typeOnly = false): Found => ({ rule, from, to, typeOnly });
    const expected = [
      // A cycle is reported once; this one closes through a type-only import, and still counts.
      { ...v("no-circular", "core/a.ts", "core/b.ts"), cycle: ["core/b.ts", "core/a.ts (type-only)"] },
      { ...v("no-circular", "tests/h1.ts", "tests/h2.ts"), cycle: ["tests/h2.ts", "tests/h1.ts"] },
      v("no-unresolvable", "core/broken.ts", "./missing.ts"),
      v("contracts-import-nothing-of-ours", "contracts/bad.ts", "core/k.ts"),
      v("core-only-core-and-contracts", "core/c.ts", "server/x.ts"),
      v("core-only-core-and-contracts", "core/c.ts", "infra/q.ts", true),
      v("providers-only-contracts-and-core", "providers/p1/index.ts", "infra/q.ts"),
      v("providers-independent", "providers/p1/index.ts", "providers/p2/index.ts"),
      v("infra-only-core-contracts-providers", "infra/bad.ts", "server/s.ts"),
      v("server-only-core-contracts-infra", "server/x.ts", "worker/w.ts"),
      v("worker-only-core-contracts-infra", "worker/w2.ts", "server/s.ts"),
      v("agent-only-contracts-and-sdk", "agent/y.ts", "core/a.ts"),
      v("sdk-only-contracts", "sdk/z.ts", "infra/q.ts"),
      v("sdk-only-contracts", "sdk/t.ts", "core/k.ts", true),
      v("web-only-sdk", "web/bad.ts", "contracts/ok.ts"),
      v("prisma-client-only-in-data-layer", "server/rows.ts", "prisma/generated/client.ts", true),
      v("prisma-client-only-in-data-layer", "cli/db.ts", "prisma/generated/client.ts"),
      v("core-inner-kernel", "core/kernel/bad.ts", "core/auth/who.ts"),
      v("core-inner-auth", "core/auth/bad.ts", "core/tenancy/q.ts", true),
      v("core-inner-tenancy", "core/tenancy/bad.ts", "core/catalog/f.ts"),
      v("core-inner-catalog", "core/catalog/bad.ts", "core/books/s.ts"),
      v("core-inner-books", "core/books/bad.ts", "core/instances/m.ts"),
      v("core-inner-commands", "core/commands/bad.ts", "core/pools/pools.ts"),
      v("core-instances-not-pools", "core/instances/bad.ts", "core/pools/registry.ts"),
      v("core-pool-seam-not-classes", "core/pools/bad.ts", "core/pools/hosted/driver.ts"),
      v("core-pool-classes-independent", "core/pools/hosted/bad.ts", "core/pools/provider/driver.ts"),
      v("core-pools-not-operations", "core/pools/provider/bad.ts", "core/sandboxes/sb.ts"),
      v("core-pool-class-code-through-driver", "core/lifecycle/classes.ts", "core/pools/hosted/impl.ts"),
      v("core-lifecycle-not-sandboxes", "core/lifecycle/bad.ts", "core/sandboxes/sb.ts"),
      v("core-sandboxes-not-teardown", "core/sandboxes/bad.ts", "core/teardown/t.ts"),
      v("core-root-outermost", "core/teardown/bad.ts", "core/drivers.ts"),
      // A folder cycle is reported from each folder on it.
      { ...v("core-folders-acyclic", "core/left", "core/right"), cycle: ["core/right", "core/left"] },
      { ...v("core-folders-acyclic", "core/right", "core/left"), cycle: ["core/left", "core/right"] },
    ];
    expect(sorted(got), `planted tree in ${dir}:\n${result.summary.violations.map(line).join("\n")}`).toEqual(sorted(expected));

    // Every rule in the config was planted here: a new rule needs a plant of its own.
    expect(new Set(house.forbidden.map((r) => r.name))).toEqual(new Set(expected.map((e) => e.rule)));
    // The Prisma client was seen as a module (so imports OF it are judged) but not cruised (its own imports are not).
    const client = result.modules.find((m) => m.source === "prisma/generated/client.ts");
    expect(client?.matchesDoNotFollow).toBe(true);
    expect(result.modules.some((m) => m.source.startsWith("prisma/generated/internal/") || m.source.startsWith("dist/"))).toBe(false);
  });

  it("process.env only in config modules", { timeout: 60_000 }, async () => {
    // The project's biome.json on a planted tree first: the rule fires outside the allowed files, and only there.
    const env = `export const v = process.env.X;\n`;
    const dir = plant({
      "core/planted.ts": env,
      "server/x.ts": `export const v = process["env"].X;\n`,
      "infra/other.ts": `import { env } from "node:process";\nexport const v = env.X;\n`,
      "agent/index.ts": env,
      "cli/agent.ts": env,
      "infra/config.ts": env,
      "agent/config.ts": env,
      // Examples are scripts users run by hand, configured like any other script of theirs.
      "examples/e.ts": env,
      "tests/unit/t.test.ts": env,
      "tests/support/harness.ts": env,
      "bench/b.ts": env,
      "scripts/s.mjs": env,
      "vitest.config.ts": env,
      "codegen.ts": env,
      "prisma.config.ts": env,
    });
    copyFileSync(join(ROOT, "biome.json"), join(dir, "biome.json"));
    const planted = await processEnvReads(dir);
    expect(planted.sort(), `planted tree in ${dir}`).toEqual(["agent/index.ts:1", "cli/agent.ts:1", "core/planted.ts:1", "infra/other.ts:2", "server/x.ts:1"]);

    // Then the repository.
    const inRepo = await processEnvReads(ROOT);
    expect(inRepo, `process.env read outside the config modules (exceptions: biome.json's overrides):\n${inRepo.join("\n")}`).toEqual([]);
  });

  it("CI runs exactly the README's test command, and that command sets up what the tests need", () => {
    const readme = readFileSync(join(ROOT, "README.md"), "utf8");
    const ci = readFileSync(join(ROOT, ".ci/run"), "utf8");
    const test = (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts.test;
    expect(readme).toMatch(/^npm test\b/m);
    expect(ci.trim().split("\n").at(-1)).toBe("npm test");
    expect(test).toMatch(/^bash scripts\/test-setup\.sh && vitest run$/);
    // The set-up covers every service a test suite talks to.
    const setup = readFileSync(join(ROOT, "scripts/test-setup.sh"), "utf8");
    for (const part of ["pg_isready", "redis-cli", "libvirtd", "@unraid/libvirt", "chromium"]) expect(setup).toContain(part);
  });

  it("the tree type-checks (the dashboard with the browser's types) and passes biome", { timeout: 180_000 }, async () => {
    const [tsc, web, biome] = await Promise.all([
      run("tsc", ["-p", "."], ROOT, 170_000),
      run("tsc", ["-p", "web"], ROOT, 170_000),
      run("biome", ["check", "--colors=off", "."], ROOT, 60_000),
    ]);
    const report = (name: string, r: Run) => `── ${name}: exit ${r.code}\n${`${r.stdout}${r.stderr}`.trim()}`;
    expect(
      { tsc: tsc.code, web: web.code, biome: biome.code },
      `${report("tsc -p .", tsc)}\n\n${report("tsc -p web", web)}\n\n${report("biome check .", biome)}`,
    ).toEqual({ tsc: 0, web: 0, biome: 0 });
  });
});
