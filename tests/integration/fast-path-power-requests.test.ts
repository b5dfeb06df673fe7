import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { holdsEqual, said } from "../support/fast-paths/property.ts";
import { type Side, startSide } from "../support/fast-paths/side.ts";

/**
 * A tenant's pause of a running instance, or resume (start) of a paused one, in one message
 * (core/lifecycle/power-requests.ts), against setDesiredState's general way: the same sequences of requests
 * (the owner's, another tenant's, the operator's), host doings and host answers leave the same rows. The
 * general side's writes lack Sql.commitBatch, which is what `powerInOneMessage` asks of the database; both
 * sides' hosts answer without naming the command, so a report takes the general way on both.
 */
let fast: Side;
let general: Side;
beforeAll(async () => {
  [fast, general] = await Promise.all([startSide(), startSide("power-requests")]);
});
afterAll(async () => {
  await Promise.all([fast?.close(), general?.close()]);
});

describe("power requests in one message", () => {
  it("leave what setDesiredState's lock, read and change leaves", async () => {
    const missed = () => fast.h.platform.counts.guessesMissed - general.h.platform.counts.guessesMissed;
    const before = missed();
    const tally = await holdsEqual({
      fast,
      general,
      weights: { create: 1, replay: 1, power: 8, host: 2, answer: 6 },
      tight: false,
      booted: true,
      named: { fast: false, general: false },
    });
    // The runs reached the cases the fast path takes and those it hands back.
    expect(tally.get("pause:ok") ?? 0, said(tally)).toBeGreaterThan(3);
    expect(tally.get("command instance.resume:succeeded settled") ?? 0, said(tally)).toBeGreaterThan(0);
    // Guesses that missed: a remembered catalog's on both sides alike, a power request's on the fast side only.
    expect(missed() - before).toBeGreaterThan(0);
  }, 120_000);
});
