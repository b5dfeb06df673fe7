import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { holdsEqual, said } from "../support/fast-paths/property.ts";
import { type Side, startSide } from "../support/fast-paths/side.ts";

/**
 * A host's report that its pause or resume succeeded, naming it (CommandReport's `power`), recorded and settled
 * in one message (`settlePowerReport`, core/commands/power.ts), against the general way (lock and record, then change):
 * the same sequences leave the same rows once the reconcile passes they ask for have run. Both sides run as
 * deployed; the fast side's hosts name their pauses and resumes (now and then wrongly), the general side's
 * never do, as agents from before the field did, and that alone takes a report the general way.
 */
let fast: Side;
let general: Side;
beforeAll(async () => {
  [fast, general] = await Promise.all([startSide(), startSide()]);
});
afterAll(async () => {
  await Promise.all([fast?.close(), general?.close()]);
});

describe("a pause's or resume's report in one message", () => {
  it("leaves what the general way and the reconciler leave", async () => {
    const tally = await holdsEqual({
      fast,
      general,
      weights: { create: 1, replay: 1, power: 8, host: 2, answer: 6 },
      tight: false,
      booted: true,
      named: { fast: true, general: false },
    });
    expect(tally.get("command instance.pause:succeeded settled") ?? 0, said(tally)).toBeGreaterThan(5);
    expect(tally.get("command instance.resume:succeeded settled") ?? 0, said(tally)).toBeGreaterThan(2);
    expect(tally.get("answer succeeded:ok") ?? 0, said(tally)).toBeGreaterThan(5);
  }, 120_000);
});
