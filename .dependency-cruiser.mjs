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
//
// Inside core/, its folders, inner to outer (each may import those above it, never one below; rules core-*):
//   kernel/           the write path, SQL, ids, validation, clock, sealing: nothing else of core/
//   auth/             kernel/
//   tenancy/          kernel/, auth/
//   catalog/          kernel/, auth/, tenancy/
//   books/            kernel/, auth/, tenancy/, catalog/
//   instances/        the instance itself (model, state table, decide, changes, events, queries): the folders above,
//                     nothing of pools/
//   commands/         host commands, a module per kind (queue, settle) and their table: kernel/ and instances/ only
//   pools/            the pool-driver seam (driver.ts, registry.ts, pools.ts, doctor.ts): the folders above
//   pools/<class>/    one pool class each (hosted/, provider/): the folders above and the seam, never another class
//   lifecycle/        admission, lifecycle and power requests, the reconciler step, snapshots: the folders above,
//                     pool classes only through the seam (driver.ts, registry.ts, pools.ts)
//   sandboxes/        the folders above, pool classes only through the seam
//   teardown/         a deleted tenant's teardown: the folders above
//   core/*.ts         core's composition (drivers.ts registers the pool drivers): anything of core/, imported by no folder of it

/** What "ours" excludes: npm packages; node builtins are left out by `dependencyTypesNot: ["core"]` below. */
const NOT_OURS = "^node_modules/";
/** The generated Prisma client has a rule of its own (prisma-client-only-in-data-layer), so no direction rule reports it twice. */
const PRISMA_CLIENT = "^prisma/generated/";

/**
 * A `to` in a folder of core/ other than `folders` (paths under core/, as regular expressions). core/'s root modules are
 * left to core-root-outermost, so an import of one is reported once. Type-only imports count, as everywhere.
 */
function coreExcept(...folders) {
  return { path: "^core/[^/]+/", pathNot: folders.map((f) => `^core/${f}/`) };
}

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
  {
    name: "core-folders-acyclic",
    severity: "error",
    scope: "folder",
    comment:
      "core/'s folders are layers: no folder of core/ may reach itself through the imports of others, type-only ones " +
      "included, and in particular no two folders import each other. Two folders that import each other both ways are " +
      "one piece that only pretends to be two: neither can be read, tested or changed without the other. The rules " +
      "below say which way each pair goes; this one holds for folders no rule names yet. dependency-cruiser counts a " +
      "folder with its subfolders here (core/pools with core/pools/hosted), so a folder and its own subfolder are kept " +
      "apart by core-pool-seam-not-classes and core-root-outermost instead.",
    from: { path: "^core/" },
    to: { circular: true },
  },
  {
    name: "core-inner-kernel",
    severity: "error",
    comment:
      "core/kernel/ (the write path, SQL access, ids, validation, clock, sealing) is what every folder of core/ stands " +
      "on, so it stands on none of them: one import of another folder and the whole domain would depend on that folder.",
    from: { path: "^core/kernel/" },
    to: coreExcept("kernel"),
  },
  {
    name: "core-inner-auth",
    severity: "error",
    comment:
      "core/auth/ (principals, scopes, tokens) says who is asking, which everything else checks: it may use the kernel " +
      "and nothing else of core/. A token's rules (its name's form) come from the kernel, the tenant a token is made " +
      "for is checked in SQL, not through core/tenancy/.",
    from: { path: "^core/auth/" },
    to: coreExcept("auth", "kernel"),
  },
  {
    name: "core-inner-tenancy",
    severity: "error",
    comment:
      "core/tenancy/ (tenants, quota, projects) is what instances, sandboxes and the books are charged to: it may use " +
      "the kernel and auth. Tearing a tenant down deletes its sandboxes and instances, so that lives outside it " +
      "(core/teardown/); quota speaks GPUs by model itself, and the catalog's shapes map onto it.",
    from: { path: "^core/tenancy/" },
    to: coreExcept("tenancy", "kernel", "auth"),
  },
  {
    name: "core-inner-catalog",
    severity: "error",
    comment:
      "core/catalog/ (shapes, flavors, images) is what a create may name: it may use the kernel, auth and tenancy, not " +
      "the pools that sell it. A flavor's pool, and its class's check of what it can sell, come from the caller " +
      "(core/pools/pools.ts flavorPool), so the pool seam can stand on the catalog.",
    from: { path: "^core/catalog/" },
    to: coreExcept("catalog", "kernel", "auth", "tenancy"),
  },
  {
    name: "core-inner-books",
    severity: "error",
    comment:
      "core/books/ (meter spans, metering, accounting, the doctor's common checks) is written by everything that holds " +
      "resources, so it may use only the folders below it: the kernel, auth, tenancy and the catalog. It names what it " +
      "reads of an instance in a type of its own, and each pool class's doctor checks live in that class's folder.",
    from: { path: "^core/books/" },
    to: coreExcept("books", "kernel", "auth", "tenancy", "catalog"),
  },
  {
    name: "core-instances-not-pools",
    severity: "error",
    comment:
      "core/instances/ is the instance itself: its model, the state table, decide, the one way a row changes " +
      "(writeChange), its events and queries. It knows nothing of pools, so every pool class can build on it: what a " +
      "class adds to a change's statement (hosted pools' spec generations) comes in through a hook the class's driver " +
      "registers (ChangeHook). The operations that act on instances through pools live above it, in core/lifecycle/.",
    from: { path: "^core/instances/" },
    to: coreExcept("instances", "kernel", "auth", "tenancy", "catalog", "books"),
  },
  {
    name: "core-inner-commands",
    severity: "error",
    comment:
      "core/commands/ (host commands: the queue, and each kind's module that queues it and settles its outcome into " +
      "the instance) is queued by the hosted pools' driver, settled by the reconciler and the host gateway: it stands " +
      "on the kernel and the instance alone, so the pool classes can build on it and none of its users reaches into " +
      "a pool class's folder for it.",
    from: { path: "^core/commands/" },
    to: coreExcept("commands", "kernel", "instances"),
  },
  {
    name: "core-pools-not-operations",
    severity: "error",
    comment:
      "core/pools/ (the seam and every pool class) is what the operations on instances are built on, so it may not use " +
      "them: not core/lifecycle/, core/sandboxes/ or core/teardown/. A driver gets what it needs from its caller " +
      "(DriverDeps, SyncIo), and its hooks are registered, not imported.",
    from: { path: "^core/pools/" },
    to: { path: "^core/(lifecycle|sandboxes|teardown)/" },
  },
  {
    name: "core-pool-seam-not-classes",
    severity: "error",
    comment:
      "The seam (core/pools/*.ts: the driver interface, the registry, pools) is what each pool class's folder builds on, " +
      "so it may not import a class: the registry is handed the drivers (core/drivers.ts registers them), and whatever " +
      "belongs to one class (a hosted pool's address range, its doctor checks) lives in that class's folder.",
    from: { path: "^core/pools/[^/]+$" },
    to: { path: "^core/pools/[^/]+/" },
  },
  {
    name: "core-pool-classes-independent",
    severity: "error",
    comment:
      "Each pool class (core/pools/<class>/) stands alone on the seam, so one can be added, changed or dropped without " +
      "touching another: a class's folder may import its own folder and the seam, never another class's.",
    from: { path: "^core/pools/([^/]+)/" },
    to: { path: "^core/pools/[^/]+/", pathNot: ["^core/pools/$1/"] },
  },
  {
    name: "core-pool-class-code-through-driver",
    severity: "error",
    comment:
      "Outside core/pools/, what depends on a pool's class is reached only through the seam: the driver interface " +
      "(driver.ts), the registry (registry.ts) and pools themselves (pools.ts). Code that imported a class's folder would " +
      "act on every pool as that class, the very thing the seam exists to prevent. core/'s root modules, which register " +
      "the drivers, are the one exception.",
    from: { path: "^core/", pathNot: ["^core/pools/", "^core/[^/]+$"] },
    to: { path: "^core/pools/", pathNot: ["^core/pools/(driver|registry|pools)[.]ts$"] },
  },
  {
    name: "core-lifecycle-not-sandboxes",
    severity: "error",
    comment:
      "core/lifecycle/ (admission, lifecycle and power requests, the reconciler step, snapshots) acts on any instance; " +
      "sandboxes are built from those operations (a sandbox's instance is admitted like any other), so lifecycle may " +
      "not use core/sandboxes/, nor core/teardown/, which drives both.",
    from: { path: "^core/lifecycle/" },
    to: { path: "^core/(sandboxes|teardown)/" },
  },
  {
    name: "core-sandboxes-not-teardown",
    severity: "error",
    comment:
      "A deleted tenant's teardown (core/teardown/) deletes its templates, sandboxes, snapshots and instances through " +
      "the paths their owners use: it stands on core/sandboxes/, which may not use it in turn.",
    from: { path: "^core/sandboxes/" },
    to: { path: "^core/teardown/" },
  },
  {
    name: "core-root-outermost",
    severity: "error",
    comment:
      "core/'s root modules (core/*.ts) compose core: drivers.ts names every pool driver and registers them. No folder " +
      "of core/ may import them, or it would depend on every pool class at once; processes (infra/platform.ts) call them.",
    from: { path: "^core/[^/]+/" },
    to: { path: "^core/[^/]+$" },
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
