import { describe, expect, it } from "vitest";
import type { Condition, Instance } from "../../core/instances/model.ts";
import type { Machine } from "../../core/pools/provider/contract.ts";
import { PROVIDER_ERROR, plan } from "../../core/pools/provider/plan.ts";

// Only what the rule reads; the rest of a row does not matter to it.
const instance = (over: Partial<Instance>) =>
  ({ state: "running", desiredState: "running", externalId: "101", addresses: ["10.0.0.5"], conditions: [], retryRequested: false, ...over }) as Instance;
const machine: Machine = { externalId: "101", instanceId: "inst_x", status: "running", addresses: ["10.0.0.5"] };
const note = (reason: string): Condition => ({ type: PROVIDER_ERROR, reason, message: "rate limited for 900 ms more" }) as Condition;
const other = { type: "Degraded", reason: "Disk", message: "slow" } as Condition;

describe("the provider plan and its failure notes", () => {
  it("rests on a running machine it has nothing to say about", () => {
    expect(plan(instance({}), machine)).toEqual({ kind: "rest" });
  });

  it("clears a transient note once a look succeeds at rest, keeping other conditions", () => {
    const step = plan(instance({ conditions: [other, note("transient")] }), machine);
    expect(step).toEqual({ kind: "change", set: { conditions: [other] }, reason: "provider:recovered", last: true });
    expect(plan(instance({ state: "stopped", desiredState: "stopped", conditions: [note("transient")] }), { ...machine, status: "stopped" })).toMatchObject({
      kind: "change",
      reason: "provider:recovered",
    });
  });

  it("keeps a note nothing was learnt about: no machine seen, or a lasting failure", () => {
    const gone = note("MachineGone");
    expect(plan(instance({ state: "lost", conditions: [gone] }), null)).toEqual({ kind: "rest" });
    expect(plan(instance({ state: "error", conditions: [note("quota")] }), machine)).toEqual({ kind: "rest" });
  });

  it("clears any note with the step that moves the instance on", () => {
    const step = plan(instance({ state: "starting", conditions: [note("transient")] }), machine);
    expect(step).toMatchObject({ kind: "change", reason: "started", set: { state: "running", conditions: [] } });
  });
});
