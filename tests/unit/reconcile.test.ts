import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { decide, type Effect, type Situation, type Step, specPower } from "../../core/instances/decide.ts";
import { canTransition, type DesiredState, desiredStates, type InstanceState, instanceStates } from "../../core/instances/state.ts";

type Observed = NonNullable<Situation["observed"]>;
type Seen = Observed["state"];

const seenStates: readonly Seen[] = ["creating", "running", "stopped", "paused", "failed", "crashed", "absent"];

/** A healthy, placed instance that wants to run and has no fresh report yet; each case overrides what it needs. */
const base: Situation = {
  state: "pending",
  desired: "running",
  placed: true,
  node: { lost: false, gone: false },
  observed: null,
  attempts: 0,
  maxAttempts: 3,
  retryRequested: false,
};
const situation = (over: Partial<Situation>): Situation => ({ ...base, ...over });

/** A fresh host report: the domain in `state`, no error, the shape the spec asks for. */
const seen = (state: Seen, more: Partial<Observed> = {}): Observed => ({ state, error: null, retryable: false, shapeMatches: true, ...more });

const healthy = { lost: false, gone: false };
const lostNode = { lost: true, gone: false };
const goneNode = { lost: false, gone: true };

const anySituation: fc.Arbitrary<Situation> = fc.record({
  state: fc.constantFrom(...instanceStates),
  desired: fc.constantFrom(...desiredStates),
  placed: fc.boolean(),
  node: fc.option(fc.record({ lost: fc.boolean(), gone: fc.boolean(), refusal: fc.option(fc.constant("host h refuses"), { nil: null }) }), { nil: null }),
  observed: fc.option(
    fc.record({
      state: fc.constantFrom(...seenStates),
      error: fc.option(fc.string(), { nil: null }),
      retryable: fc.boolean(),
      shapeMatches: fc.boolean(),
    }),
    { nil: null },
  ),
  attempts: fc.integer({ min: 0, max: 5 }),
  maxAttempts: fc.integer({ min: 1, max: 5 }),
  retryRequested: fc.boolean(),
  crashed: fc.boolean(),
  crashes: fc.integer({ min: 0, max: 5 }),
});

/**
 * `deleting` is entered only once `desired` is `deleted`, and setDesiredState refuses to change a deleted desired
 * state, so a `deleting` instance that wants anything else cannot arise. It is excluded from the main property and
 * pinned by its own regression case below.
 */
const reachable = (s: Situation) => !(s.state === "deleting" && s.desired !== "deleted");

describe("decide: every combination", () => {
  it("proposes only legal transitions, never to the state it is in, and nothing once deleted", () => {
    fc.assert(
      fc.property(anySituation, (s) => {
        fc.pre(reachable(s));
        const step = decide(s);
        if (s.state === "deleted") expect(step).toBeNull();
        if (step?.to) {
          expect(canTransition(s.state, step.to), `${s.state} → ${step.to}`).toBe(true);
          expect(step.to).not.toBe(s.state);
        }
        // A step that moves nowhere must at least do something.
        if (step && step.to === null) expect(step.effects?.length).toBeGreaterThan(0);
      }),
      { numRuns: 10_000 },
    );
  });

  // Found by the property above (once failing): the node-gone branch sent a `deleting` instance to `lost`, which
  // the table forbids. Unreachable through the API (see `reachable`), kept as a regression test.
  it("proposes no illegal transition for a deleting instance that does not want deletion, on a gone node", () => {
    const s = situation({ state: "deleting", desired: "running", placed: true, node: goneNode, observed: null });
    const step = decide(s);
    expect(step?.to == null || canTransition(s.state, step.to)).toBe(true);
  });
});

/** What a case checks of a step: where it goes, its effects, and the surfaced host error; not the reason label. */
function summary(step: Step | null) {
  if (!step) return null;
  return {
    to: step.to,
    ...(step.effects ? { effects: step.effects } : {}),
    ...(step.runtimeError !== undefined ? { runtimeError: step.runtimeError } : {}),
    ...(step.conditionReason !== undefined ? { conditionReason: step.conditionReason } : {}),
  };
}

type Expected = { to: InstanceState | null; effects?: Effect[]; runtimeError?: unknown; conditionReason?: string } | null;

const cases: [name: string, over: Partial<Situation>, expected: Expected][] = [
  // Creation
  ["pending → scheduling", { state: "pending" }, { to: "scheduling" }],
  ["pending → scheduling, even when created stopped", { state: "pending", desired: "stopped" }, { to: "scheduling" }],
  ["scheduling, placed → provisioning", { state: "scheduling", placed: true }, { to: "provisioning" }],
  ["scheduling, not placed → place, no transition", { state: "scheduling", placed: false, node: null }, { to: null, effects: ["place"] }],
  ["provisioning, host defined it stopped, wanted running → starting", { state: "provisioning", observed: seen("stopped") }, { to: "starting" }],
  [
    "provisioning, host defined it stopped, wanted stopped → stopped",
    { state: "provisioning", desired: "stopped", observed: seen("stopped") },
    { to: "stopped" },
  ],
  ["provisioning, host already running it → starting", { state: "provisioning", observed: seen("running") }, { to: "starting" }],
  ["provisioning, host still creating → wait", { state: "provisioning", observed: seen("creating") }, null],
  ["starting, host running → running", { state: "starting", observed: seen("running") }, { to: "running" }],
  ["starting, wanted stopped and host stopped → stopped", { state: "starting", desired: "stopped", observed: seen("stopped") }, { to: "stopped" }],

  // Power
  ["running, wanted stopped, host stopped → stopped", { state: "running", desired: "stopped", observed: seen("stopped") }, { to: "stopped" }],
  ["running, wanted stopped, host still running → wait", { state: "running", desired: "stopped", observed: seen("running") }, null],
  ["running, guest powered off → stopped", { state: "running", desired: "running", observed: seen("stopped") }, { to: "stopped" }],
  ["stopped, wanted running → starting", { state: "stopped", desired: "running", observed: seen("stopped") }, { to: "starting" }],
  ["stopped, wanted stopped → nothing", { state: "stopped", desired: "stopped", observed: seen("stopped") }, null],
  ["resizing, host stopped with the new shape → stopped", { state: "resizing", desired: "stopped", observed: seen("stopped") }, { to: "stopped" }],
  ["resizing, host stopped with the old shape → wait", { state: "resizing", desired: "stopped", observed: seen("stopped", { shapeMatches: false }) }, null],
  [
    "resizing, host refuses the new shape → error with its message",
    { state: "resizing", desired: "stopped", observed: seen("failed", { error: "cannot shrink", retryable: false }) },
    { to: "error", runtimeError: "cannot shrink" },
  ],
  ["running, wanted paused, host paused → paused", { state: "running", desired: "paused", observed: seen("paused") }, { to: "paused" }],
  ["running, wanted paused, host not yet paused → wait", { state: "running", desired: "paused", observed: seen("running") }, null],
  ["paused, wanted paused → nothing", { state: "paused", desired: "paused", observed: seen("paused") }, null],
  ["paused, wanted running, host resumed → running", { state: "paused", desired: "running", observed: seen("running") }, { to: "running" }],
  ["paused, host stopped → stopped", { state: "paused", desired: "stopped", observed: seen("stopped") }, { to: "stopped" }],

  // Deletion
  ["running, wanted deleted → deleting", { state: "running", desired: "deleted", observed: seen("running") }, { to: "deleting" }],
  ["pending, wanted deleted → deleting", { state: "pending", desired: "deleted", placed: false, node: null }, { to: "deleting" }],
  ["error, wanted deleted → deleting", { state: "error", desired: "deleted" }, { to: "deleting" }],
  ["lost, wanted deleted → deleting", { state: "lost", desired: "deleted", node: lostNode }, { to: "deleting" }],
  ["deleting, host still reports the domain → wait", { state: "deleting", desired: "deleted", observed: seen("stopped") }, null],
  ["deleting, no fresh report → wait", { state: "deleting", desired: "deleted", observed: null }, null],
  ["deleting, host reports it absent → deleted", { state: "deleting", desired: "deleted", observed: seen("absent") }, { to: "deleted" }],
  ["deleting, not placed → deleted", { state: "deleting", desired: "deleted", placed: false, node: null }, { to: "deleted" }],
  ["deleting, node gone → deleted", { state: "deleting", desired: "deleted", node: goneNode, observed: seen("running") }, { to: "deleted" }],
  ["deleted → nothing", { state: "deleted", desired: "deleted", observed: seen("absent") }, null],

  // Lost and gone nodes
  ["running on a lost node → lost", { state: "running", node: lostNode, observed: seen("running") }, { to: "lost" }],
  ["stopped on a lost node → lost", { state: "stopped", desired: "stopped", node: lostNode }, { to: "lost" }],
  ["provisioning on a lost node → lost", { state: "provisioning", node: lostNode }, { to: "lost" }],
  ["pending with a lost node → nothing", { state: "pending", node: lostNode }, null],
  ["scheduling with a lost node → nothing", { state: "scheduling", node: lostNode }, null],
  ["lost, node still lost → nothing", { state: "lost", node: lostNode, observed: seen("running") }, null],
  ["lost, node back and running it → running", { state: "lost", node: healthy, observed: seen("running") }, { to: "running" }],
  ["lost, node back and holding it stopped → stopped", { state: "lost", node: healthy, observed: seen("stopped") }, { to: "stopped" }],
  ["lost, node back and holding it paused → paused", { state: "lost", node: healthy, observed: seen("paused") }, { to: "paused" }],
  ["lost, node back without the domain → scheduling", { state: "lost", node: healthy, observed: seen("absent") }, { to: "scheduling" }],
  ["lost, node back but no fresh report → wait", { state: "lost", node: healthy, observed: null }, null],
  ["running on a gone node → lost", { state: "running", node: goneNode, observed: seen("running") }, { to: "lost" }],
  ["lost on a gone node → scheduling, recreate", { state: "lost", node: goneNode }, { to: "scheduling", effects: ["recreate"] }],

  // Hosts that cannot create or start it
  [
    "provisioning, retryable failure, attempts left → scheduling, recreate",
    { state: "provisioning", attempts: 0, maxAttempts: 3, observed: seen("failed", { retryable: true, error: "no space on /var/lib" }) },
    { to: "scheduling", effects: ["recreate"], runtimeError: "no space on /var/lib" },
  ],
  [
    "provisioning, retryable failure without a message → recreate with a default message",
    { state: "provisioning", attempts: 1, maxAttempts: 3, observed: seen("failed", { retryable: true }) },
    { to: "scheduling", effects: ["recreate"], runtimeError: expect.any(String) },
  ],
  [
    "provisioning, retryable failure at the bound → error",
    { state: "provisioning", attempts: 2, maxAttempts: 3, observed: seen("failed", { retryable: true, error: "no space on /var/lib" }) },
    { to: "error", runtimeError: "no space on /var/lib" },
  ],
  [
    "provisioning, failure that no host can fix → error with the host's message",
    { state: "provisioning", observed: seen("failed", { retryable: false, error: "image is not a bootable disk" }) },
    { to: "error", runtimeError: "image is not a bootable disk" },
  ],
  [
    "running, host reports a failure → error",
    { state: "running", observed: seen("failed", { error: "qemu exited" }) },
    { to: "error", runtimeError: "qemu exited" },
  ],
  [
    "starting, the host cannot start it but another might → back to stopped, with its message",
    { state: "starting", observed: seen("failed", { retryable: true, error: "no hugepages left" }) },
    { to: "stopped", runtimeError: "no hugepages left" },
  ],
  [
    "stopped, wanted running, its host cannot start it, attempts left → scheduling, recreate",
    { state: "stopped", attempts: 0, observed: seen("failed", { retryable: true, error: "no hugepages left" }) },
    { to: "scheduling", effects: ["recreate"], runtimeError: "no hugepages left" },
  ],
  [
    "stopped, wanted running, its host cannot start it, at the bound → error",
    { state: "stopped", attempts: 2, maxAttempts: 3, observed: seen("failed", { retryable: true, error: "no hugepages left" }) },
    { to: "error", runtimeError: "no hugepages left" },
  ],
  [
    "stopped, wanted running, a start no host could make → error",
    { state: "stopped", observed: seen("failed", { retryable: false, error: "kernel not found" }) },
    { to: "error", runtimeError: "kernel not found" },
  ],
  [
    "starting, a start no host could make → error",
    { state: "starting", observed: seen("failed", { retryable: false, error: "kernel not found" }) },
    { to: "error", runtimeError: "kernel not found" },
  ],
  ["stopped, wanted stopped, an old refusal → nothing", { state: "stopped", desired: "stopped", observed: seen("failed", { retryable: true }) }, null],
  ["error, retry requested → starting, clear the request", { state: "error", retryRequested: true }, { to: "starting", effects: ["clear-retry"] }],
  [
    "error, retry requested, wanted paused → starting",
    { state: "error", desired: "paused", retryRequested: true },
    { to: "starting", effects: ["clear-retry"] },
  ],
  ["error, retry requested but wanted stopped → no retry", { state: "error", desired: "stopped", retryRequested: true, observed: seen("failed") }, null],
  ["error, no retry requested → nothing", { state: "error", retryRequested: false, observed: seen("stopped") }, null],
  ["error, wanted stopped and host stopped → stopped", { state: "error", desired: "stopped", observed: seen("stopped") }, { to: "stopped" }],

  // Crashes: recorded as such, then the owner's intent
  [
    "running, the guest crashed → error naming the crash, to be started again",
    { state: "running", observed: seen("crashed", { error: "fake: the guest crashed" }) },
    { to: "error", runtimeError: expect.stringMatching(/^fake: the guest crashed; starting it again \(crash 1 /), conditionReason: "GuestCrashed" },
  ],
  [
    "running, crashed at the bound → error that says it stays stopped",
    { state: "running", crashes: 2, maxAttempts: 3, observed: seen("crashed") },
    { to: "error", runtimeError: expect.stringMatching(/^the guest crashed; 3 crashes in 10 minutes: it stays stopped/), conditionReason: "GuestCrashed" },
  ],
  [
    "starting, crashed while booting → error",
    { state: "starting", observed: seen("crashed") },
    { to: "error", runtimeError: expect.any(String), conditionReason: "GuestCrashed" },
  ],
  [
    "provisioning, crashed → error",
    { state: "provisioning", observed: seen("crashed") },
    { to: "error", runtimeError: expect.any(String), conditionReason: "GuestCrashed" },
  ],
  [
    "paused, crashed → error",
    { state: "paused", desired: "paused", observed: seen("crashed") },
    { to: "error", runtimeError: expect.any(String), conditionReason: "GuestCrashed" },
  ],
  [
    "lost, node back with the guest crashed → error",
    { state: "lost", node: healthy, observed: seen("crashed") },
    { to: "error", runtimeError: expect.any(String), conditionReason: "GuestCrashed" },
  ],
  ["stopped, wanted stopped, a crash reported late → nothing (the host stops it)", { state: "stopped", desired: "stopped", observed: seen("crashed") }, null],
  [
    "error after a crash, wanted running, host has it stopped → starting",
    { state: "error", crashed: true, crashes: 1, observed: seen("stopped") },
    { to: "starting" },
  ],
  [
    "error after a crash, wanted paused, host has it stopped → starting",
    { state: "error", desired: "paused", crashed: true, crashes: 1, observed: seen("stopped") },
    { to: "starting" },
  ],
  ["error after a crash, host not yet stopped it → wait", { state: "error", crashed: true, crashes: 1, observed: seen("crashed") }, null],
  ["error after a crash, no fresh report → wait", { state: "error", crashed: true, crashes: 1, observed: null }, null],
  ["error after a crash, at the bound → left to its owner", { state: "error", crashed: true, crashes: 3, maxAttempts: 3, observed: seen("stopped") }, null],
  [
    "error after a crash, wanted stopped, host stopped → stopped",
    { state: "error", desired: "stopped", crashed: true, crashes: 1, observed: seen("stopped") },
    { to: "stopped" },
  ],
  ["error not from a crash, wanted running, host stopped → left to its owner", { state: "error", crashed: false, observed: seen("stopped") }, null],

  // A host that refuses its pool's spec (it lacks the pool's runtime)
  [
    "provisioning on a refusing host → scheduling elsewhere, saying why",
    { state: "provisioning", node: { lost: false, gone: false, refusal: "host h lacks x" }, observed: seen("absent") },
    { to: "scheduling", effects: ["recreate"], runtimeError: "host h lacks x", conditionReason: "RuntimeMissing" },
  ],
  [
    "provisioning on a refusing host, at the bound → error",
    { state: "provisioning", attempts: 2, maxAttempts: 3, node: { lost: false, gone: false, refusal: "host h lacks x" } },
    { to: "error", runtimeError: "host h lacks x", conditionReason: "RuntimeMissing" },
  ],
  [
    "running on a refusing host, whatever it reports → wait",
    { state: "running", node: { lost: false, gone: false, refusal: "r" }, observed: seen("absent") },
    null,
  ],
  ["stopped on a refusing host, wanted running → wait", { state: "stopped", node: { lost: false, gone: false, refusal: "r" } }, null],
  ["pending, placed on a refusing host → scheduling", { state: "pending", node: { lost: false, gone: false, refusal: "r" } }, { to: "scheduling" }],
  [
    "running on a refusing host, wanted deleted → deleting",
    { state: "running", desired: "deleted", node: { lost: false, gone: false, refusal: "r" } },
    { to: "deleting" },
  ],

  // Stale reports: the host has not answered the current spec yet
  ["provisioning, no fresh report → wait", { state: "provisioning", observed: null }, null],
  ["starting, no fresh report → wait", { state: "starting", observed: null }, null],
];

describe("decide: the main paths", () => {
  it.each(cases)("%s", (_name, over, expected) => {
    expect(summary(decide(situation(over)))).toEqual(expected);
  });
});

/** What the simulated host reports for the spec as it now is: the domain gone once deletion is asked, else its power. */
function hostReport(state: InstanceState, desired: DesiredState): Observed {
  return desired === "deleted" ? seen("absent") : seen(specPower(state, desired));
}

const targetOf: Record<DesiredState, InstanceState> = { running: "running", stopped: "stopped", paused: "paused", deleted: "deleted" };

/**
 * Drives one instance toward `desired`: at each look the host has either answered the current spec (a fresh report)
 * or not yet (`staleLooks`, cycled, a stale look seeing no report). Applies each step as the reconciler would,
 * checking it is legal. Fails when a fresh look yields nothing short of the target, or after `maxSteps` steps.
 */
function converge(start: Situation, desired: DesiredState, staleLooks: readonly boolean[] = [], maxSteps = 10): { s: Situation; path: InstanceState[] } {
  let s: Situation = { ...start, desired };
  const path: InstanceState[] = [s.state];
  const pattern = [...staleLooks, false];
  let steps = 0;
  for (let look = 0; s.state !== targetOf[desired]; look++) {
    const stale = pattern[look % pattern.length];
    const step = decide({ ...s, observed: stale ? null : hostReport(s.state, s.desired) });
    if (!step) {
      if (stale) continue;
      throw new Error(`stuck in ${s.state} wanting ${desired} with the host reporting ${specPower(s.state, desired)}; path ${path.join(" → ")}`);
    }
    steps++;
    if (steps > maxSteps) throw new Error(`not ${targetOf[desired]} after ${maxSteps} steps: ${path.join(" → ")}`);
    if (step.to) {
      expect(canTransition(s.state, step.to), `${s.state} → ${step.to}`).toBe(true);
      s = { ...s, state: step.to };
      path.push(step.to);
    }
    for (const effect of step.effects ?? []) {
      if (effect === "place") s = { ...s, placed: true };
      if (effect === "recreate") s = { ...s, placed: false, attempts: s.attempts + 1 };
      if (effect === "clear-retry") s = { ...s, retryRequested: false };
    }
  }
  return { s, path };
}

describe("decide: convergence against a host that does what the spec asks", () => {
  const fresh = situation({ state: "pending", desired: "running", placed: true, node: healthy, observed: null });
  const lag = fc.array(fc.boolean(), { maxLength: 4 });

  it("creates and runs, stops, then deletes, each within 10 legal steps", () => {
    fc.assert(
      fc.property(lag, lag, lag, (lagRun, lagStop, lagDelete) => {
        const run = converge(fresh, "running", lagRun);
        expect(run.path).toEqual(["pending", "scheduling", "provisioning", "starting", "running"]);
        const stop = converge(run.s, "stopped", lagStop);
        expect(stop.path).toEqual(["running", "stopped"]);
        const gone = converge(stop.s, "deleted", lagDelete);
        expect(gone.path).toEqual(["stopped", "deleting", "deleted"]);
      }),
      { seed: 20_240_611, numRuns: 200 },
    );
  });

  it("follows any sequence of start and stop requests, then deletes", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.constantFrom<DesiredState>("running", "stopped"), lag), { minLength: 1, maxLength: 6 }), lag, (requests, lagDelete) => {
        let s = fresh;
        for (const [desired, stale] of requests) {
          s = converge(s, desired, stale).s;
          expect(s.state).toBe(targetOf[desired]);
        }
        expect(converge(s, "deleted", lagDelete).s.state).toBe("deleted");
      }),
      { seed: 20_240_611, numRuns: 200 },
    );
  });

  it("creates an instance asked for stopped without booting it", () => {
    expect(converge(fresh, "stopped").path).toEqual(["pending", "scheduling", "provisioning", "stopped"]);
  });

  it("pauses a running instance and resumes it", () => {
    const running = converge(fresh, "running").s;
    const paused = converge(running, "paused");
    expect(paused.path).toEqual(["running", "paused"]);
    expect(converge(paused.s, "running").path).toEqual(["paused", "running"]);
  });

  // Regression (once stuck in `starting`): the host was told `paused` before the instance was running, and the
  // table has no starting → paused. specPower now boots it first, and it pauses from running.
  it("pauses a stopped instance", () => {
    const stopped = situation({ state: "stopped", desired: "stopped", observed: seen("stopped") });
    expect(converge(stopped, "paused").s.state).toBe("paused");
  });
});

/** Apply a step as the reconciler would (state, recreate, retry); the observation is the caller's to set. */
function apply(s: Situation, step: Step | null): Situation {
  expect(step).not.toBeNull();
  const st = step as Step;
  if (st.to) expect(canTransition(s.state, st.to), `${s.state} → ${st.to}`).toBe(true);
  let next: Situation = { ...s, state: st.to ?? s.state };
  for (const effect of st.effects ?? []) {
    if (effect === "place") next = { ...next, placed: true };
    if (effect === "recreate") next = { ...next, placed: false, attempts: next.attempts + 1, observed: null };
    if (effect === "clear-retry") next = { ...next, retryRequested: false };
  }
  return next;
}

describe("decide: against the reference's state table", () => {
  it("a stopped instance its host cannot start goes to another host, and runs there", () => {
    let s = situation({ state: "stopped", desired: "running", observed: seen("stopped") });
    const path: InstanceState[] = [s.state];
    s = apply(s, decide(s));
    // The host refuses the start: stopped again, then recreated elsewhere (placed anew, created, started).
    s = apply(s, decide({ ...s, observed: seen("failed", { retryable: true, error: "no hugepages" }) }));
    path.push(s.state);
    s = apply(s, decide({ ...s, observed: seen("failed", { retryable: true, error: "no hugepages" }) }));
    path.push(s.state);
    s = apply(s, decide(s));
    s = apply(s, decide({ ...s, observed: null }));
    path.push(s.state);
    s = apply(s, decide({ ...s, observed: seen("stopped") }));
    s = apply(s, decide({ ...s, observed: seen("running") }));
    path.push(s.state);
    expect(path).toEqual(["stopped", "stopped", "scheduling", "provisioning", "running"]);
    expect(s.attempts).toBe(1);
  });

  it("an instance in error starts again when its owner asks, and only then", () => {
    const failed = situation({ state: "error", desired: "running", observed: seen("failed", { error: "kernel not found" }) });
    expect(decide(failed)).toBeNull();
    const retried = apply(failed, decide({ ...failed, retryRequested: true }));
    expect(retried.state).toBe("starting");
    expect(apply(retried, decide({ ...retried, observed: seen("running") })).state).toBe("running");
  });

  it("a guest that keeps crashing is restarted up to the bound, then waits for its owner", () => {
    let s = situation({ state: "running", desired: "running", maxAttempts: 3, observed: seen("running") });
    for (let crash = 1; crash <= 3; crash++) {
      s = apply(s, decide({ ...s, crashes: crash - 1, observed: seen("crashed") }));
      expect(s.state).toBe("error");
      s = { ...s, crashed: true, crashes: crash };
      const next = decide({ ...s, observed: seen("stopped") });
      if (crash === 3) {
        expect(next).toBeNull();
        break;
      }
      s = apply(s, next);
      s = apply(s, decide({ ...s, observed: seen("running") }));
      expect(s.state).toBe("running");
    }
    // The owner asks again, or stops it: either is followed.
    expect(decide({ ...s, retryRequested: true, observed: seen("stopped") })?.to).toBe("starting");
    expect(decide({ ...s, desired: "stopped", observed: seen("stopped") })?.to).toBe("stopped");
  });
});
