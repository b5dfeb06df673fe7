import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { holdsEqual, said } from "../support/fast-paths/property.ts";
import { type Side, startSide } from "../support/fast-paths/side.ts";

/**
 * A create from the remembered catalog (`lookupCache`, core/lifecycle/lookup.ts: admission's one statement,
 * gated on the catalog read again and the instance absent) against a create that looks its catalog up (the
 * general side has no `lookups`): with flavors changed, deleted and made again, images withdrawn and back,
 * projects of either tenant, replays under the same key and conflicting ones, quotas and full pools, the same
 * creates are admitted or refused alike and leave the same rows.
 */
let fast: Side;
let general: Side;
beforeAll(async () => {
  [fast, general] = await Promise.all([startSide(), startSide("catalog")]);
});
afterAll(async () => {
  await Promise.all([fast?.close(), general?.close()]);
});

describe("creates from the remembered catalog", () => {
  it("admit and refuse what creates that look the catalog up admit and refuse", async () => {
    const missed = () => fast.h.platform.counts.guessesMissed - general.h.platform.counts.guessesMissed;
    const before = missed();
    const tally = await holdsEqual({
      fast,
      general,
      weights: { create: 10, replay: 3, flavor: 3, image: 3, quota: 1, release: 1 },
      tight: true,
      booted: false,
      named: { fast: false, general: false },
    });
    for (const reached of ["create:ok", "create:NOT_FOUND", "create:CONFLICT", "replay:ok", "create:QUOTA_EXCEEDED", "flavor:ok", "image:withdrawn"])
      expect(tally.get(reached) ?? 0, `${reached}: ${said(tally)}`).toBeGreaterThan(0);
    // Creates built on a remembered catalog that changed, and replays of remembered creates, missed (on the
    // fast side only: the general side remembers nothing).
    expect(missed() - before, said(tally)).toBeGreaterThan(0);
  }, 120_000);
});
