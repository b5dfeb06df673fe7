import type { InstanceSet } from "../../instances/changes.ts";
import type { Condition, Instance } from "../../instances/model.ts";
import type { Machine } from "./contract.ts";

/**
 * The provider reconciler's rule, pure: from the instance as stored and the machine as the provider shows it
 * now, the one thing to do next. Either a guarded change of the row (a state-table step, or what the provider
 * made: its id, its addresses), one call to the provider, a wait while the provider works, or rest.
 *
 * `machine` is null when the provider has no such machine: by the recorded external id, or, before one is
 * recorded, by the instance's label (a machine a crashed worker made is found, and adopted, that way).
 */
export type Step =
  /** `last`: the look found nothing left to do but this write; it neither wakes the instance nor looks again. */
  | { kind: "change"; set: InstanceSet; reason: string; last?: true }
  /** Reaching `deleted`: the quota charge is released with it, once. */
  | { kind: "deleted" }
  | { kind: "call"; call: "create" | "start" | "stop" | "delete" }
  | { kind: "wait" }
  | { kind: "rest" };

/** The condition of a failed provider call; `reason` is the failure's class. */
export const PROVIDER_ERROR = "ProviderError";

const transientNote = (c: Condition) => c.type === PROVIDER_ERROR && c.reason === "transient";
const withoutProviderErrors = (c: readonly Condition[]) => c.filter((x) => x.type !== PROVIDER_ERROR);

/** The change that clears an instance's ProviderError conditions, if it has any. */
export const clearedProviderErrors = (inst: Pick<Instance, "conditions">) =>
  inst.conditions.some((c) => c.type === PROVIDER_ERROR) ? { conditions: withoutProviderErrors(inst.conditions) } : {};
const sameAddresses = (a: readonly string[], b: readonly string[]) => a.length === b.length && a.every((x, i) => x === b[i]);

/** A non-transient provider failure waits for its owner (a start is a retry), except on the way out. */
export function blocked(inst: Instance): boolean {
  return inst.desiredState !== "deleted" && !inst.retryRequested && inst.conditions.some((c) => c.type === PROVIDER_ERROR && c.reason !== "transient");
}

export function plan(inst: Instance, machine: Machine | null): Step {
  const step = next(inst, machine);
  // A look that succeeded ends a transient failure's note: left on an instance at rest, "rate limited" would
  // describe a running machine for good. (A step on the way clears it already; a lasting failure stays.)
  if (step.kind === "rest" && machine && inst.conditions.some(transientNote))
    return {
      kind: "change",
      set: { conditions: inst.conditions.filter((c) => !transientNote(c)) },
      reason: "provider:recovered",
      // Looking again at once, under a rate limit still spent by others, would be refused and noted again.
      last: true,
    };
  return step;
}

function next(inst: Instance, machine: Machine | null): Step {
  const m = machine;
  const clear = clearedProviderErrors(inst);
  const seen = m ? { external_id: m.externalId, ...(sameAddresses(m.addresses, inst.addresses) ? {} : { addresses: m.addresses }) } : {};
  const to = (state: Instance["state"], reason: string, extra: InstanceSet = {}): Step => ({
    kind: "change",
    set: { state, ...seen, ...clear, ...extra },
    reason,
  });

  if (inst.state === "deleted") return { kind: "rest" };
  if (inst.desiredState === "deleted") {
    if (inst.state !== "deleting") return to("deleting", "delete");
    if (!m) return { kind: "deleted" };
    return m.status === "deleting" ? { kind: "wait" } : { kind: "call", call: "delete" };
  }
  if (inst.state === "pending") return to("scheduling", "schedule");
  if (inst.state === "scheduling") return m ? to("provisioning", inst.externalId ? "place" : "provider:created") : { kind: "call", call: "create" };
  if (inst.state === "error") {
    if (!inst.retryRequested) return { kind: "rest" };
    if (!m) return to("scheduling", "retry", { external_id: null, retry_requested: false });
    return inst.desiredState === "stopped" ? to("stopped", "retry", { retry_requested: false }) : to("starting", "retry", { retry_requested: false });
  }
  if (!m) {
    if (inst.state === "lost") return { kind: "rest" };
    return to("lost", "provider:gone", {
      conditions: [
        ...withoutProviderErrors(inst.conditions),
        { type: PROVIDER_ERROR, reason: "MachineGone", message: `the provider no longer has machine ${inst.externalId}` },
      ],
    });
  }
  if (inst.externalId !== m.externalId) return { kind: "change", set: seen, reason: "provider:adopted" };
  if (m.status !== "running" && m.status !== "stopped") return { kind: "wait" };
  const running = m.status === "running";
  const wantRunning = inst.desiredState === "running";

  switch (inst.state) {
    case "lost":
      return to(running ? "running" : "stopped", "provider:found");
    case "provisioning":
      if (running) return wantRunning ? to("starting", "provision") : { kind: "call", call: "stop" };
      return wantRunning ? to("starting", "provision") : to("stopped", "stopped");
    case "starting":
      if (running) return to("running", "started");
      return wantRunning ? { kind: "call", call: "start" } : to("stopped", "stopped");
    case "running":
      if (!running) return to("stopped", "stopped");
      if (!wantRunning) return { kind: "call", call: "stop" };
      return "addresses" in seen ? { kind: "change", set: { addresses: m.addresses }, reason: "provider:addresses" } : { kind: "rest" };
    case "stopped":
      if (wantRunning) return to("starting", "start");
      return running ? { kind: "call", call: "stop" } : { kind: "rest" };
    default:
      // paused, rebooting, resizing: no provider instance enters them.
      return { kind: "rest" };
  }
}
