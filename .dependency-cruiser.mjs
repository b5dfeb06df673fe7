// The house rules for who may import whom, checked by dependency-cruiser.
//
//   npm run deps                      cruise the repository (also part of `npm run check`)
//   node .dependency-cruiser.mjs DIR  the same for one folder or file
//
// dependency-cruiser's own command (`depcruise`) refuses Node 20, which this project supports, so running this
// file cruises through dependency-cruiser's JS API instead; on Node 22+ `npx depcruise --config .dependency-cruiser.mjs .`
// reads the same configuration. tests/unit/house.test.ts imports `forbidden` and `options` from here, cruises the
// repository with them, and plants each kind of violation in a throwaway tree to prove every rule can fail.
//
// Paths below are regular expressions over paths relative to the repository root, '/'-separated.
//
// The layers, inner to outer:
//   contracts/        shared contracts (zod schemas, errors): imports nothing of ours
//   core/             domain rules: core/ and contracts/
//   providers/        provider plugins (providers/<id>/: contracts/, core/ and their own folder, never another plugin)
//                     and the registry beside them (providers/*.ts), which may import the plugins
//   infra/            process plumbing: core/, contracts/, providers/
//   server/, worker/  core/, contracts/, infra/ (and never each other)
//   agent/            the host agent: contracts/ and sdk/ only
//   sdk/              the typed client: contracts/ only
//   web/              the dashboard (a browser bundle): sdk/ only
//   cli/              the composition root: anything
//   tests/, bench/, scripts/, examples/ and root files are exempt from the direction rules, not from the cycle rule.

/** What "ours" excludes: npm packages; node builtins are left out by `dependencyTypesNot: ["core"]` below. */
const NOT_OURS = "^node_modules/";
/** The generated Prisma client has a rule of its own (prisma-client-only-in-data-layer), so no direction rule reports it twice. */
const PRISMA_CLIENT = "^prisma/generated/";

/**
 * A `to` matching a module of ours outside `allowed`: a resolved file in this repository, not an npm package, not a
 * node builtin, not the Prisma client. Type-only imports count: a type from an outer layer couples the inner one to it
 * as much as a value does.
 */
function oursExcept(...allowed) {
  return { pathNot: [NOT_OURS, PRISMA_CLIENT, ...allowed], dependencyTypesNot: ["core"], couldNotResolve: false };
}

/** @type {import("dependency-cruiser").IForbiddenRuleType[]} */
export const forbidden = [
  {
    name: "no-circular",
    severity: "error",
    comment:
      "Modules must not depend on themselves through others: a cycle makes load order matter (an import can see an " +
      "uninitialised binding), and two modules in a cycle can only be understood, tested and moved together. Type-only " +
      "imports count too: a cycle of types still ties the modules' meaning together, and the layering below is only " +
      "a layering if it has no loops. Break a cycle by moving the shared piece inward (contracts/ or core/kernel/).",
    from: {},
    to: { circular: true },
  },
  {
    name: "no-unresolvable",
    severity: "error",
    comment:
      "Every import must resolve to a file or a package. An import that resolves to nothing is a broken move (or a " +
      "missing dependency), and no other rule here can judge where it points.",
    from: {},
    to: { couldNotResolve: true },
  },
  {
    name: "contracts-import-nothing-of-ours",
    severity: "error",
    comment:
      "contracts/ is what every process and the agent share (host protocol, bus channels, job catalog, errors). If it " +
      "imported anything of ours, everything that speaks a contract would drag that along, the agent included.",
    from: { path: "^contracts/" },
    to: oursExcept("^contracts/"),
  },
  {
    name: "core-only-core-and-contracts",
    severity: "error",
    comment:
      "core/ holds the domain rules. It must not know how it is served (server/), run in the background (worker/), " +
      "wired to processes (infra/, cli/), talked to (sdk/), which providers exist (providers/), nor the agent. That " +
      "keeps the rules testable without a process around them, and lets the outer layers change without touching them.",
    from: { path: "^core/" },
    to: oursExcept("^core/", "^contracts/"),
  },
  {
    name: "providers-only-contracts-and-core",
    severity: "error",
    comment:
      "A provider plugin implements core's provider-pool contract and nothing more: providers/ may use contracts/, " +
      "core/ and providers/. Not infra/ (the platform loads plugins, not the other way round), not server/, worker/, " +
      "cli/, the agent or the sdk.",
    from: { path: "^providers/" },
    to: oursExcept("^contracts/", "^core/", "^providers/"),
  },
  {
    name: "providers-independent",
    severity: "error",
    comment:
      "Each plugin in providers/<id>/ stands alone, so one can be added, changed or dropped without touching another: " +
      "a plugin may import its own folder but no other plugin, nor the registry beside them (providers/index.ts), which " +
      "imports the plugins. providers/emulator.ts is the one exception: the interface every plugin's emulator offers " +
      "the tests, which imports no plugin.",
    from: { path: "^providers/([^/]+)/" },
    to: { path: "^providers/", pathNot: ["^providers/$1/", "^providers/emulator[.]ts$"] },
  },
  {
    name: "infra-only-core-contracts-providers",
    severity: "error",
    comment:
      "infra/ is the process plumbing (config, database, bus, jobs, log, platform) that server/ and worker/ stand on. " +
      "It may use core/, contracts/ and providers/ but not the processes built on top of it (server/, worker/, cli/), " +
      "nor the agent or the sdk.",
    from: { path: "^infra/" },
    to: oursExcept("^infra/", "^core/", "^contracts/", "^providers/"),
  },
  {
    name: "server-only-core-contracts-infra",
    severity: "error",
    comment:
      "server/ (the GraphQL API) is one process, worker/ another: neither may import the other, or running one would " +
      "load the other. The server may use core/, contracts/ and infra/; not cli/, providers/ (through infra/), the " +
      "agent or the sdk.",
    from: { path: "^server/" },
    to: oursExcept("^server/", "^core/", "^contracts/", "^infra/"),
  },
  {
    name: "worker-only-core-contracts-infra",
    severity: "error",
    comment:
      "worker/ (background jobs) is its own process: it may use core/, contracts/ and infra/, never server/ (or " +
      "starting a worker would load the API), cli/, providers/ (through infra/), the agent or the sdk.",
    from: { path: "^worker/" },
    to: oursExcept("^worker/", "^core/", "^contracts/", "^infra/"),
  },
  {
    name: "agent-only-contracts-and-sdk",
    severity: "error",
    comment:
      "agent/ runs on every host, away from the control plane, and talks to it only over the wire: through the sdk " +
      "and the host protocol in contracts/. Importing core/, infra/, server/ or the Prisma client would ship the " +
      "control plane (and its database layer) to every host and tie the agent to its internals.",
    from: { path: "^agent/" },
    to: oursExcept("^agent/", "^contracts/", "^sdk/"),
  },
  {
    name: "sdk-only-contracts",
    severity: "error",
    comment:
      "sdk/ is the typed client that users and the agent embed: it may use contracts/ and itself only, so that " +
      "depending on it never pulls in the control plane.",
    from: { path: "^sdk/" },
    to: oursExcept("^sdk/", "^contracts/"),
  },
  {
    name: "web-only-sdk",
    severity: "error",
    comment:
      "web/ is the dashboard, bundled for the browser: it talks to the platform through the API like any client, " +
      "so it may use sdk/ and itself only. Anything else would drag server code (and its secrets' handling) into a " +
      "bundle anyone can download.",
    from: { path: "^web/" },
    to: oursExcept("^web/", "^sdk/"),
  },
  {
    name: "prisma-client-only-in-data-layer",
    severity: "error",
    comment:
      "The generated Prisma client is the data layer's business: only infra/db/ (and tests/, bench/) may import it. " +
      "Everything else goes through infra/db/, so the schema can change behind one folder and the rest of the code " +
      "never sees a Prisma type.",
    from: { pathNot: ["^infra/db/", "^tests/", "^bench/", PRISMA_CLIENT] },
    to: { path: PRISMA_CLIENT },
  },
];

/** @type {import("dependency-cruiser").ICruiseOptions} */
export const options = {
  // Not cruised as sources. npm packages and the Prisma client are still recorded where something imports them
  // (so prisma-client-only-in-data-layer sees every import OF prisma/generated), but what they import is not followed.
  doNotFollow: { path: ["(^|/)node_modules/", PRISMA_CLIENT] },
  // Never part of the graph: build output and local data.
  exclude: { path: ["(^|/)dist/", "^\\.data/", "^\\.git/"] },
  moduleSystems: ["es6", "cjs"],
  // Parse TypeScript with swc: dependency-cruiser's tsc parser needs the JS compiler API, which TypeScript 7 (the
  // native one this project uses) does not ship. swc marks `import type` as "type-only", and type-only imports are
  // subject to every rule above.
  parser: "swc",
  // Resolve the way TypeScript does for this project (module nodenext, explicit .ts extensions).
  tsConfig: { fileName: "tsconfig.json" },
  enhancedResolveOptions: {
    exportsFields: ["exports"],
    conditionNames: ["import", "require", "node", "default", "types"],
    mainFields: ["module", "main", "types", "typings"],
    extensions: [".ts", ".mts", ".cts", ".d.ts", ".js", ".mjs", ".cjs", ".json"],
  },
  skipAnalysisNotInRules: true,
};

export default { forbidden, options };

/**
 * Cruises `targets` (paths relative to `baseDir`) with these rules through dependency-cruiser's JS API.
 * Returns how many modules it saw and the violations, each as { rule, from, to, typeOnly, cycle? }.
 */
export async function cruiseHouse(targets = ["."], { baseDir = process.cwd(), tsConfigFile = "tsconfig.json" } = {}) {
  const { cruise } = await import("dependency-cruiser");
  const { resolve } = await import("node:path");
  const result = await cruise(
    targets,
    { ...options, baseDir, tsConfig: { fileName: resolve(baseDir, tsConfigFile) }, validate: true, ruleSet: { forbidden } },
    {},
    {},
  );
  if (typeof result.output === "string") throw new Error("dependency-cruiser returned a report, not a cruise result");
  return {
    modules: result.output.modules.length,
    violations: result.output.summary.violations.map((v) => ({
      rule: v.rule.name,
      from: v.from,
      to: v.to,
      ...(v.cycle ? { cycle: v.cycle.map((hop) => ({ name: hop.name, typeOnly: hop.dependencyTypes.includes("type-only") })) } : {}),
      typeOnly: v.dependencyTypes?.includes("type-only") ?? false,
    })),
  };
}

/** One line per violation: `rule: from → to`, a cycle spelled out hop by hop; "(type-only)" marks `import type` hops. */
export function describe(violation) {
  if (violation.cycle) {
    const hops = violation.cycle.map((hop) => `${hop.name}${hop.typeOnly ? " (type-only)" : ""}`);
    return `${violation.rule}: ${[violation.from, ...hops].join(" → ")}`;
  }
  return `${violation.rule}: ${violation.from} → ${violation.to}${violation.typeOnly ? " (type-only)" : ""}`;
}

// `node .dependency-cruiser.mjs [paths…]`: cruise, print each violation, exit 1 if there are any.
if (process.argv[1] && import.meta.url === (await import("node:url")).pathToFileURL(process.argv[1]).href) {
  const targets = process.argv.slice(2);
  const { modules, violations } = await cruiseHouse(targets.length > 0 ? targets : ["."]);
  for (const v of violations) console.log(describe(v));
  console.log(`\n${modules} modules cruised, ${violations.length} dependency rule violation${violations.length === 1 ? "" : "s"}`);
  process.exitCode = violations.length > 0 ? 1 : 0;
}
