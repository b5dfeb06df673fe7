import fc from "fast-check";
import { expect } from "vitest";
import { type Op, sequence, type Weights, type WorldParams, worldParams } from "./ops.ts";
import type { Side } from "./side.ts";
import { makeWorld } from "./world.ts";

/**
 * The property every fast path is held to: a random sequence, run on a fresh world of each side (the fast
 * path's and the general path's), leaves the same answers and the same rows. FAST_PATHS_RUNS and
 * FAST_PATHS_SEED widen or replay a run (fast-check prints the seed and the sequence of a failure).
 */
export const RUNS = Number(process.env.FAST_PATHS_RUNS ?? 30);
export const SEED = Number(process.env.FAST_PATHS_SEED ?? 20261207);

export interface Comparison {
  fast: Side;
  general: Side;
  weights: Weights;
  /** Small nodes, ranges and quotas, so that refusals happen. */
  tight: boolean;
  /** Sequences open with instances created and booted (ops.ts `sequence`). */
  booted: boolean;
  /** Whether each side's hosts name a pause or resume in its report (`power`). */
  named: { fast: boolean; general: boolean };
}

/** What happened over all runs, by operation and outcome (`create:ok`, `create:QUOTA_EXCEEDED`, …): the cases the runs reached. */
export type Tally = Map<string, number>;

let runs = 0;
const count = (t: Tally, key: string) => t.set(key, (t.get(key) ?? 0) + 1);

async function runOn(side: Side, params: WorldParams, ops: Op[], k: number, namedReports: boolean) {
  const world = await makeWorld(side, params, k, { namedReports });
  for (const o of ops) await world.apply(o);
  return world.result();
}

export async function holdsEqual(c: Comparison): Promise<Tally> {
  const tally: Tally = new Map();
  await fc.assert(
    fc.asyncProperty(worldParams(c.tight), sequence(c.weights, { booted: c.booted }), async (params, ops) => {
      const k = ++runs;
      const [fast, general] = await Promise.all([runOn(c.fast, params, ops, k, c.named.fast), runOn(c.general, params, ops, k, c.named.general)]);
      expect(fast, "the fast path's run (+ Received) and the general path's (- Expected) differ").toEqual(general);
      const seen = fast as { answers: { op: Op; out: unknown }[]; rows: { commands: { kind: string; state: string; settled: boolean }[] } };
      for (const cmd of seen.rows.commands) count(tally, `command ${cmd.kind}:${cmd.state}${cmd.settled ? " settled" : ""}`);
      for (const step of seen.answers) {
        const out = step.out as { error?: string; message?: string } | string | null;
        // An UNSCHEDULABLE create says whether the range or the nodes ran out.
        const short = out && typeof out === "object" && out.error === "UNSCHEDULABLE" ? (/IPv4/.test(out.message ?? "") ? " address" : " node") : "";
        const what = typeof out === "string" ? out : out?.error ? `${out.error}${short}` : "ok";
        const name = step.op.op === "power" ? step.op.verb : step.op.op === "answer" ? `answer ${step.op.state}` : step.op.op;
        count(tally, `${name}:${what}`);
      }
    }),
    { numRuns: RUNS, seed: SEED, endOnFailure: true },
  );
  return tally;
}

/** The tally as one line, for an assertion's message. */
export const said = (t: Tally) => [...t.entries()].map(([k, n]) => `${k} ${n}`).join(", ");
