import { describe, expect, it } from "vitest";
import { assertTransition, canTransition, IllegalTransition, type InstanceState, instanceStates, instanceStateTable } from "../../core/instances/state.ts";

// The spec's diagram, edge by edge, plus the rules stated around it. Every pair not listed here is illegal.
const expected: [InstanceState, InstanceState][] = [
  ["pending", "scheduling"],
  ["scheduling", "provisioning"],
  ["provisioning", "starting"],
  ["provisioning", "scheduling"],
  ["provisioning", "stopped"],
  ["starting", "running"],
  ["starting", "stopped"],
  ["running", "stopped"],
  ["running", "rebooting"],
  ["rebooting", "running"],
  ["running", "paused"],
  ["paused", "running"],
  ["paused", "stopped"],
  ["stopped", "starting"],
  ["stopped", "resizing"],
  ["stopped", "scheduling"],
  ["resizing", "stopped"],
  ["lost", "running"],
  ["lost", "stopped"],
  ["lost", "paused"],
  ["lost", "scheduling"],
  ["error", "starting"],
  ["error", "stopped"],
  // A provider refused a create: the owner's start tries again from scheduling.
  ["error", "scheduling"],
  ["deleting", "deleted"],
  ...instanceStates.filter((s) => s !== "deleting" && s !== "deleted").map((s) => [s, "deleting"] as [InstanceState, InstanceState]),
  ...(["scheduling", "provisioning", "starting", "running", "stopped", "rebooting", "resizing", "paused", "lost"] as const).map(
    (s) => [s, "error"] as [InstanceState, InstanceState],
  ),
  ...(["provisioning", "starting", "running", "stopped", "rebooting", "resizing", "paused", "error"] as const).map(
    (s) => [s, "lost"] as [InstanceState, InstanceState],
  ),
];
const legal = new Set(expected.map(([a, b]) => `${a}>${b}`));

describe("instance state table", () => {
  it("holds every state", () => {
    expect([...instanceStateTable.keys()].sort()).toEqual([...instanceStates].sort());
  });

  for (const from of instanceStates) {
    for (const to of instanceStates) {
      const ok = legal.has(`${from}>${to}`);
      it(`${from} → ${to} is ${ok ? "legal" : "illegal"}`, () => {
        expect(canTransition(from, to)).toBe(ok);
        if (ok) expect(typeof assertTransition(from, to)).toBe("string");
        else expect(() => assertTransition(from, to)).toThrow(IllegalTransition);
      });
    }
  }

  it("has no way out of deleted and only one out of deleting", () => {
    expect(instanceStateTable.get("deleted")?.size).toBe(0);
    expect([...(instanceStateTable.get("deleting")?.keys() ?? [])]).toEqual(["deleted"]);
  });

  it("names the spec's transitions", () => {
    expect(assertTransition("provisioning", "scheduling")).toBe("recreate");
    expect(assertTransition("stopped", "scheduling")).toBe("recreate");
    expect(assertTransition("error", "starting")).toBe("start");
    expect(assertTransition("lost", "running")).toBe("recover");
    expect(assertTransition("running", "deleting")).toBe("delete");
  });

  it("reaches every state from pending", () => {
    const seen = new Set<InstanceState>(["pending"]);
    const queue: InstanceState[] = ["pending"];
    for (let s = queue.shift(); s; s = queue.shift()) {
      for (const next of instanceStateTable.get(s)?.keys() ?? []) {
        if (seen.has(next)) continue;
        seen.add(next);
        queue.push(next);
      }
    }
    expect([...seen].sort()).toEqual([...instanceStates].sort());
  });
});
