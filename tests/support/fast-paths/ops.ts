import fc from "fast-check";

/**
 * What a sequence of a fast-path property is made of: a tenant's and another tenant's requests, the host's
 * doings, and the operator's changes to what creates stand on. Targets are indexes, taken modulo what the run
 * has by then (its instances in creation order, its commands in creation order), so every sequence runs.
 */
export type Op =
  | {
      op: "create";
      key: number;
      flavor: number;
      image: "public" | "private" | "missing";
      project: "none" | "own" | "other";
      desired: "RUNNING" | "STOPPED";
      by: "owner" | "other";
    }
  /** An earlier create sent again as it was. */
  | { op: "replay"; of: number }
  /** A request; `hostSays`: the host answers the command it queued (if any) at once, as a live agent does. */
  | { op: "power"; verb: "pause" | "start" | "stop" | "delete"; target: number; by: "owner" | "other" | "operator"; hostSays: "succeeded" | "failed" | null }
  /** The host takes the instance where its owner wants it (booted, stopped, or gone): tests/support/reconcile.ts. */
  | { op: "host"; target: number }
  /** The owner deletes the instance and the host confirms it gone: what it held is given back. */
  | { op: "release"; target: number }
  /** The host's report on a command (`command` counts from the newest unfinished): naming a pause or resume (`power`) where the run's hosts do. */
  | { op: "answer"; command: number; state: "running" | "succeeded" | "failed"; wrongName: boolean; otherNode: boolean }
  | { op: "flavor"; flavor: number; change: "grow" | "shrink" | "delete" | "recreate" }
  | { op: "image"; which: "public" | "private"; withdrawn: boolean }
  | { op: "quota"; instances: number | null; vcpus: number | null }
  | { op: "node"; node: number; state: "CORDONED" | "READY" };

/** The flavors every run's pool starts with; index 3 of a create names one the pool never had. */
export const FLAVORS = [
  { name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 },
  { name: "medium", vcpus: 2, memoryMib: 2048, diskGib: 20 },
  { name: "big", vcpus: 4, memoryMib: 4096, diskGib: 40 },
] as const;

export interface WorldParams {
  nodes: { vcpus: number; memoryMib: number; diskGib: number }[];
  /** The pool's range: /30 holds one address, /29 five, /28 thirteen. */
  prefix: 28 | 29 | 30;
  quota: { instances: number | null; vcpus: number | null };
  /** A single-tenant pool: a node holding one tenant's instances takes no other's. */
  singleTenant: boolean;
}

export type Weights = Partial<Record<Op["op"], number>>;

const weighted = <T>(...choices: [number, T][]) => fc.oneof(...choices.map(([weight, v]) => ({ weight, arbitrary: fc.constant(v) })));

const arbitraries: { [K in Op["op"]]: fc.Arbitrary<Extract<Op, { op: K }>> } = {
  create: fc.record({
    op: fc.constant("create" as const),
    key: fc.nat(3),
    flavor: weighted([6, 0], [3, 1], [2, 2], [1, 3]),
    image: weighted<"public" | "private" | "missing">([8, "public"], [2, "private"], [1, "missing"]),
    project: weighted<"none" | "own" | "other">([6, "none"], [3, "own"], [1, "other"]),
    desired: weighted<"RUNNING" | "STOPPED">([4, "RUNNING"], [1, "STOPPED"]),
    by: weighted<"owner" | "other">([5, "owner"], [1, "other"]),
  }),
  replay: fc.record({ op: fc.constant("replay" as const), of: fc.nat(7) }),
  power: fc.record({
    op: fc.constant("power" as const),
    verb: weighted<"pause" | "start" | "stop" | "delete">([5, "pause"], [5, "start"], [1, "stop"], [1, "delete"]),
    target: fc.nat(7),
    by: weighted<"owner" | "other" | "operator">([8, "owner"], [1, "other"], [1, "operator"]),
    hostSays: weighted<"succeeded" | "failed" | null>([5, "succeeded"], [1, "failed"], [3, null]),
  }),
  host: fc.record({ op: fc.constant("host" as const), target: fc.nat(7) }),
  release: fc.record({ op: fc.constant("release" as const), target: fc.nat(7) }),
  answer: fc.record({
    op: fc.constant("answer" as const),
    // Mostly the command the host would take next, sometimes one answered before.
    command: weighted([6, 0], [2, 1], [1, 2], [1, 5]),
    state: weighted<"running" | "succeeded" | "failed">([1, "running"], [8, "succeeded"], [2, "failed"]),
    wrongName: weighted([8, false], [1, true]),
    otherNode: weighted([12, false], [1, true]),
  }),
  flavor: fc.record({
    op: fc.constant("flavor" as const),
    flavor: fc.nat(2),
    change: weighted<"grow" | "shrink" | "delete" | "recreate">([3, "grow"], [2, "shrink"], [2, "delete"], [2, "recreate"]),
  }),
  image: fc.record({ op: fc.constant("image" as const), which: weighted<"public" | "private">([3, "public"], [1, "private"]), withdrawn: fc.boolean() }),
  quota: fc.record({
    op: fc.constant("quota" as const),
    instances: fc.option(fc.integer({ min: 0, max: 4 }), { freq: 3 }),
    vcpus: fc.option(fc.integer({ min: 1, max: 8 }), { freq: 3 }),
  }),
  node: fc.record({ op: fc.constant("node" as const), node: fc.nat(1), state: weighted<"CORDONED" | "READY">([1, "CORDONED"], [1, "READY"]) }),
};

/**
 * A sequence of at most `max` operations, each kind as often as its weight says (absent: never). With
 * `booted`, it opens with one or two plain creates of the owner's, each taken by the host where it is wanted
 * and some paused, so that power requests and host answers have something to act on from the start.
 */
export function sequence(weights: Weights, opts: { max?: number; booted?: boolean } = {}): fc.Arbitrary<Op[]> {
  const max = opts.max ?? 12;
  const kinds = (Object.entries(weights) as [Op["op"], number][]).filter(([, w]) => w > 0);
  const body = fc.oneof(...kinds.map(([k, weight]) => ({ weight, arbitrary: arbitraries[k] as fc.Arbitrary<Op> })));
  const plain = fc.record({
    op: fc.constant("create" as const),
    key: fc.nat(3),
    flavor: fc.nat(1),
    image: fc.constant("public" as const),
    project: fc.constant("none" as const),
    desired: weighted<"RUNNING" | "STOPPED">([4, "RUNNING"], [1, "STOPPED"]),
    by: fc.constant("owner" as const),
  });
  const pause = (target: number): Op => ({ op: "power", verb: "pause", target, by: "owner", hostSays: "succeeded" });
  const opening = opts.booted
    ? fc
        .array(fc.tuple(plain, fc.boolean()), { minLength: 1, maxLength: 2 })
        .map((cs) => cs.flatMap(([c, paused], i): Op[] => [c, { op: "host", target: i }, ...(paused ? [pause(i)] : [])]))
    : fc.constant([] as Op[]);
  return opening.chain((first) =>
    fc.array(body, { minLength: Math.max(1, max - first.length - 4), maxLength: max - first.length }).map((rest) => [...first, ...rest]),
  );
}

/** Pools and quotas: roomy by default; `tight` makes a full node, a used-up range and a spent quota likely. */
export function worldParams(tight: boolean): fc.Arbitrary<WorldParams> {
  const node: fc.Arbitrary<WorldParams["nodes"][number]> = tight
    ? fc.record({ vcpus: fc.integer({ min: 2, max: 6 }), memoryMib: fc.constantFrom(4096, 6144, 8192), diskGib: fc.constantFrom(60, 100) })
    : fc.constant({ vcpus: 16, memoryMib: 32768, diskGib: 500 });
  return fc.record({
    nodes: fc.array(node, { minLength: 1, maxLength: 2 }),
    prefix: tight ? fc.constantFrom<28 | 29 | 30>(29, 30, 28) : fc.constant<28>(28),
    quota: tight
      ? fc.record({ instances: fc.option(fc.integer({ min: 1, max: 5 })), vcpus: fc.option(fc.integer({ min: 2, max: 8 })) })
      : fc.constant({ instances: null, vcpus: null }),
    singleTenant: tight ? weighted([3, false], [1, true]) : fc.constant(false),
  });
}
