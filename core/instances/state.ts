/**
 * The instance state machine, as data. Every write of `state` goes through `assertTransition`, and the
 * table is small enough to test every pair of states.
 */
export const instanceStates = [
  "pending",
  "scheduling",
  "provisioning",
  "starting",
  "running",
  "stopped",
  "rebooting",
  "resizing",
  "deleting",
  "deleted",
  "error",
  "lost",
  "paused",
] as const;
export type InstanceState = (typeof instanceStates)[number];

export const desiredStates = ["running", "stopped", "paused", "deleted"] as const;
export type DesiredState = (typeof desiredStates)[number];

/** Why a transition happens; events carry it as their reason. */
export type TransitionKind =
  | "schedule"
  | "place"
  | "provision"
  | "start"
  | "started"
  | "stop"
  | "stopped"
  | "reboot"
  | "resize"
  | "resized"
  | "pause"
  | "resume"
  | "fail"
  | "lose"
  | "recover"
  | "recreate"
  | "delete"
  | "deleted";

type Edge = readonly [from: InstanceState, to: InstanceState, kind: TransitionKind];

const edges: readonly Edge[] = [
  ["pending", "scheduling", "schedule"],
  ["scheduling", "provisioning", "place"],
  ["provisioning", "starting", "provision"],
  ["provisioning", "stopped", "stopped"], // created with desiredState stopped: defined, never booted
  ["provisioning", "scheduling", "recreate"],
  ["starting", "running", "started"],
  ["starting", "stopped", "stopped"], // the guest powered off, or a stop arrived while booting
  ["running", "stopped", "stop"],
  ["running", "rebooting", "reboot"],
  ["rebooting", "running", "started"],
  ["running", "paused", "pause"],
  ["paused", "running", "resume"],
  ["paused", "stopped", "stop"],
  ["stopped", "starting", "start"],
  ["stopped", "resizing", "resize"],
  ["stopped", "scheduling", "recreate"],
  ["resizing", "stopped", "resized"],
  ["lost", "running", "recover"],
  ["lost", "stopped", "recover"],
  ["lost", "paused", "recover"],
  ["lost", "scheduling", "recreate"],
  ["error", "starting", "start"],
  ["error", "stopped", "stopped"],
  ["error", "scheduling", "recreate"], // a retry of a create that made no machine (a provider refused it)
  ["deleting", "deleted", "deleted"],
];

/**
 * Everything short of deleting can be deleted; anything a host runs can fail or vanish with its host, and a
 * create a provider refuses fails in scheduling.
 */
const deletable = instanceStates.filter((s) => s !== "deleting" && s !== "deleted");
const canFail: readonly InstanceState[] = ["scheduling", "provisioning", "starting", "running", "stopped", "rebooting", "resizing", "paused", "lost"];
const canBeLost: readonly InstanceState[] = ["provisioning", "starting", "running", "stopped", "rebooting", "resizing", "paused", "error"];

export const instanceStateTable: ReadonlyMap<InstanceState, ReadonlyMap<InstanceState, TransitionKind>> = (() => {
  const table = new Map<InstanceState, Map<InstanceState, TransitionKind>>(instanceStates.map((s) => [s, new Map()]));
  const add = (from: InstanceState, to: InstanceState, kind: TransitionKind) => {
    table.get(from)?.set(to, kind);
  };
  for (const [from, to, kind] of edges) add(from, to, kind);
  for (const s of deletable) add(s, "deleting", "delete");
  for (const s of canFail) add(s, "error", "fail");
  for (const s of canBeLost) add(s, "lost", "lose");
  return table;
})();

export function canTransition(from: InstanceState, to: InstanceState): boolean {
  return instanceStateTable.get(from)?.has(to) ?? false;
}

export class IllegalTransition extends Error {
  constructor(
    readonly from: InstanceState,
    readonly to: InstanceState,
  ) {
    super(`illegal instance transition ${from} → ${to}`);
    this.name = "IllegalTransition";
  }
}

export function assertTransition(from: InstanceState, to: InstanceState): TransitionKind {
  const kind = instanceStateTable.get(from)?.get(to);
  if (!kind) throw new IllegalTransition(from, to);
  return kind;
}
