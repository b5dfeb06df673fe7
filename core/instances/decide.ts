import type { ObservedState } from "../../contracts/host.ts";
import type { DesiredState, InstanceState } from "./state.ts";

/** What the reconciler knows when it looks at one hosted instance. */
export interface Situation {
  state: InstanceState;
  desired: DesiredState;
  /** The instance holds an allocation on a node. */
  placed: boolean;
  /**
   * Its node: silent past the grace (`lost`), declared gone by an operator (`gone`), or refusing its pool's
   * spec (`refusal`: why, in words for the owner; its host lacks the pool's runtime).
   */
  node: { lost: boolean; gone: boolean; refusal?: string | null } | null;
  /**
   * The host's latest word on the domain, counted only when it answers the spec as it now is (the report's
   * generation has caught up with the instance's last change); `absent`: the host reported, without it.
   */
  observed: { state: ObservedState | "absent"; error: string | null; retryable: boolean; shapeMatches: boolean } | null;
  /** Recreates so far; the bound on them, and on restarts after crashes within CRASH_WINDOW_MS. */
  attempts: number;
  maxAttempts: number;
  retryRequested: boolean;
  /** It is in error because its guest crashed (its RuntimeError condition says so). */
  crashed?: boolean;
  /** Crashes recorded within CRASH_WINDOW_MS, the one that put it in error included. */
  crashes?: number;
}

/** The window in which crashes count toward the bound on restarting an instance after one. */
export const CRASH_WINDOW_MS = 10 * 60_000;

export type Effect =
  /** Find a node for it (scheduling without a placement). */
  | "place"
  /** Give back the allocation on the host that refused it, count the attempt, avoid that host next time. */
  | "recreate"
  /** Clear a retry request once acted on. */
  | "clear-retry";

export interface Step {
  to: InstanceState | null;
  reason: string;
  effects?: Effect[];
  /** The host's error, surfaced as a RuntimeError condition (with `conditionReason`, default HostReported). */
  runtimeError?: string;
  conditionReason?: "HostReported" | "GuestCrashed" | "RuntimeMissing";
}

const powered: Record<"running" | "stopped" | "paused", InstanceState> = { running: "running", stopped: "stopped", paused: "paused" };

/**
 * The next step for a hosted instance, or null when there is nothing to do until something changes.
 * At most one transition per call: the reconciler applies it, then asks again.
 */
export function decide(s: Situation): Step | null {
  const o = s.observed;
  if (s.state === "deleted") return null;

  if (s.desired === "deleted") {
    if (s.state !== "deleting") return { to: "deleting", reason: "delete" };
    // Released only once the host confirms the domain gone, or there is no host to ask.
    if (!s.placed || !s.node || s.node.gone || o?.state === "absent") return { to: "deleted", reason: s.node?.gone ? "node-gone" : "host:gone" };
    return null;
  }

  if (s.node?.gone && s.placed) {
    if (s.state === "lost") return { to: "scheduling", reason: "recreate:node-gone", effects: ["recreate"] };
    if (s.state !== "pending" && s.state !== "scheduling" && s.state !== "deleting") return { to: "lost", reason: "node-gone" };
  }
  if (s.node?.lost) {
    const runsThere = ["provisioning", "starting", "running", "stopped", "rebooting", "resizing", "paused", "error"].includes(s.state);
    return runsThere ? { to: "lost", reason: "host-silent" } : null;
  }

  // A host that refuses its pool's spec does nothing for it, and what it reports says nothing of the pool's
  // instances: one it was to create goes elsewhere; the others wait for it (their condition says why).
  if (s.node?.refusal && s.placed) {
    if (s.state === "provisioning") {
      return s.attempts + 1 < s.maxAttempts
        ? { to: "scheduling", reason: "recreate:runtime-missing", effects: ["recreate"], runtimeError: s.node.refusal, conditionReason: "RuntimeMissing" }
        : { to: "error", reason: "host:runtime-missing", runtimeError: s.node.refusal, conditionReason: "RuntimeMissing" };
    }
    if (s.state !== "pending" && s.state !== "scheduling") return null;
  }

  // A crash is recorded as one, never taken for a guest that powered off: error, and from there the owner's intent.
  if (o?.state === "crashed" && ["provisioning", "starting", "running", "rebooting", "paused", "lost"].includes(s.state)) {
    return { to: "error", reason: "host:crashed", runtimeError: crashMessage(s, o.error), conditionReason: "GuestCrashed" };
  }

  if (o?.state === "failed") {
    const message = o.error ?? "the host reported a failure";
    const elsewhere = o.retryable && s.attempts + 1 < s.maxAttempts;
    if (s.state === "provisioning" && elsewhere) {
      return { to: "scheduling", reason: "recreate:host-refused", effects: ["recreate"], runtimeError: o.error ?? "the host could not create the instance" };
    }
    // A host that cannot start an instance still holds it, stopped: back to stopped, and from there to another
    // host (a recreate from its image: the disk stays with the host that cannot run it).
    if (s.state === "starting" && elsewhere) return { to: "stopped", reason: "host:start-refused", runtimeError: message };
    if (s.state === "stopped" && s.desired !== "stopped") {
      return elsewhere
        ? { to: "scheduling", reason: "recreate:host-cannot-start", effects: ["recreate"], runtimeError: message }
        : { to: "error", reason: "host:failed", runtimeError: message };
    }
    if (["provisioning", "starting", "running", "paused", "resizing"].includes(s.state)) return { to: "error", reason: "host:failed", runtimeError: message };
  }

  switch (s.state) {
    case "pending":
      return { to: "scheduling", reason: "schedule" };
    case "scheduling":
      return s.placed ? { to: "provisioning", reason: "placed" } : { to: null, reason: "place", effects: ["place"] };
    case "provisioning":
      if (o?.state === "running") return { to: "starting", reason: "host:defined" };
      if (o?.state === "stopped") return { to: s.desired === "stopped" ? "stopped" : "starting", reason: "host:defined" };
      return null;
    case "starting":
      if (o?.state === "running") return { to: "running", reason: "host:running" };
      if (o?.state === "stopped" && s.desired === "stopped") return { to: "stopped", reason: "host:stopped" };
      return null;
    case "running":
      if (o?.state === "absent") return { to: "lost", reason: "host:domain-missing" };
      if (o?.state === "stopped") return { to: "stopped", reason: s.desired === "stopped" ? "host:stopped" : "host:powered-off" };
      if (o?.state === "paused" && s.desired === "paused") return { to: "paused", reason: "host:paused" };
      return null;
    case "paused":
      if (o?.state === "running" && s.desired === "running") return { to: "running", reason: "host:resumed" };
      if (o?.state === "stopped") return { to: "stopped", reason: "host:stopped" };
      return null;
    case "stopped":
      if (s.desired === "running" || s.desired === "paused") return { to: "starting", reason: "start" };
      return null;
    case "resizing":
      if (o?.state === "stopped" && o.shapeMatches) return { to: "stopped", reason: "host:resized" };
      return null;
    case "error":
      if (s.retryRequested && s.desired !== "stopped") return { to: "starting", reason: "retry", effects: ["clear-retry"] };
      // After a crash the owner still wants it up: booted again once its host has it stopped, a bounded number
      // of times (a guest that crashes on every boot is left for its owner, who can start it again).
      if (s.crashed && s.desired !== "stopped" && o?.state === "stopped" && (s.crashes ?? 0) < s.maxAttempts)
        return { to: "starting", reason: "restart:crashed" };
      if (s.desired === "stopped" && o?.state === "stopped") return { to: "stopped", reason: "host:stopped" };
      return null;
    case "lost":
      if (!s.node || !o) return null;
      if (o.state === "running" || o.state === "stopped" || o.state === "paused") return { to: powered[o.state], reason: "recover" };
      if (o.state === "absent") return { to: "scheduling", reason: "recreate:domain-missing" };
      return null;
    default:
      return null;
  }
}

/**
 * The steps `decide` takes from `s` without news from a host and without effects of their own, in order: what
 * a write that already holds the facts (admission, which placed the instance) may take at once.
 */
export function stepsWithoutHost(s: Situation): { to: InstanceState; reason: string }[] {
  const steps: { to: InstanceState; reason: string }[] = [];
  for (let at = s; steps.length < 8; ) {
    const step = decide(at);
    if (!step?.to || step.effects?.length || step.runtimeError) break;
    steps.push({ to: step.to, reason: step.reason });
    at = { ...at, state: step.to };
  }
  return steps;
}

/** A crash's condition message: what the host said, and what follows it. */
function crashMessage(s: Situation, error: string | null): string {
  const what = error ?? "the guest crashed";
  const count = (s.crashes ?? 0) + 1;
  const minutes = CRASH_WINDOW_MS / 60_000;
  if (s.desired === "stopped") return what;
  if (count < s.maxAttempts) return `${what}; starting it again (crash ${count} in ${minutes} minutes; at ${s.maxAttempts} it stays stopped)`;
  return `${what}; ${count} crashes in ${minutes} minutes: it stays stopped until it is started`;
}

/** The power state the host should hold a domain in, from where the instance is and what is wanted. */
export function specPower(state: InstanceState, desired: DesiredState): "running" | "stopped" | "paused" {
  if (state === "error" || state === "resizing" || desired === "stopped" || desired === "deleted") return "stopped";
  // Pausing is a step from running (the table has no starting → paused): boot first, pause once running.
  if (desired === "paused" && state !== "running" && state !== "paused") return "running";
  return desired;
}
