import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { holdsEqual, said } from "../support/fast-paths/property.ts";
import { type Side, startSide } from "../support/fast-paths/side.ts";

/**
 * A hosted create's address and node taken in admission's last statement (`Placed.deferred`,
 * core/pools/hosted/driver.ts), against placing it step by step first (`place`, as GPU requests, restores and
 * retries are; the general side sets DriverDeps.placeStepByStep): on small nodes, small ranges and small
 * quotas, with replays, deletes that give back, cordoned nodes and changed flavors, the same creates are
 * admitted or refused alike (the same code and words), on the same node and address, and leave the same rows.
 */
let fast: Side;
let general: Side;
beforeAll(async () => {
  // Both look every catalog up: a create from memory takes admission's gate, which the step-by-step way
  // reaches only after it has placed (see the catalog's property), and that is not what this one compares.
  [fast, general] = await Promise.all([startSide("catalog"), startSide("catalog", "deferred-hold")]);
});
afterAll(async () => {
  await Promise.all([fast?.close(), general?.close()]);
});

describe("the deferred hold at admission", () => {
  it("admits and refuses what step-by-step placement admits and refuses, and holds the same", async () => {
    const tally = await holdsEqual({
      fast,
      general,
      weights: { create: 10, replay: 2, release: 3, power: 1, host: 2, quota: 1, node: 1, flavor: 1 },
      tight: true,
      booted: false,
      named: { fast: false, general: false },
    });
    for (const reached of ["create:ok", "create:QUOTA_EXCEEDED", "create:UNSCHEDULABLE node", "create:UNSCHEDULABLE address", "replay:ok", "release:ok"])
      expect(tally.get(reached) ?? 0, `${reached}: ${said(tally)}`).toBeGreaterThan(0);
  }, 120_000);
});
