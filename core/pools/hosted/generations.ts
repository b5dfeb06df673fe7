import { specPower } from "../../instances/decide.ts";
import type { DesiredState, InstanceState } from "../../instances/state.ts";
import type { Write } from "../../kernel/write.ts";

/**
 * Spec generations: a node's generation goes up in the transaction of every change to what its agent should
 * do, and the agent echoes the generation it applied. A report older than an instance's last change says
 * nothing about that change, which is how the reconciler tells a fresh observation from a stale one.
 */

/** States in which the host should hold the domain (with the power specPower gives). */
export const HELD_STATES: readonly InstanceState[] = ["provisioning", "starting", "running", "stopped", "paused", "resizing", "rebooting", "error", "lost"];

/** The statement that bumps the nodes' generations (`ids`: a text[] placeholder), returning "nodeId", generation. */
export const specsBumpedSql = (ids: string) =>
  `UPDATE nodes SET spec_generation = spec_generation + 1 WHERE id = ANY(${ids}::text[]) RETURNING id AS "nodeId", spec_generation AS generation`;

/** The nodes named, once each and in id order (the order their rows are locked in). */
export const specNodes = (nodeIds: readonly (string | null | undefined)[]) => [...new Set(nodeIds.filter((n): n is string => !!n))].sort();

/** Bump the generation of nodes whose desired set changed; the agents hear of it once the write commits. */
export async function bumpSpecs(w: Write, nodeIds: readonly (string | null | undefined)[]): Promise<{ nodeId: string; generation: number }[]> {
  const unique = specNodes(nodeIds);
  if (!unique.length) return [];
  const rows = await w.sql.query<{ nodeId: string; generation: number }>(specsBumpedSql("$1"), [unique]);
  for (const r of rows) w.spec(r.nodeId, r.generation);
  return rows;
}

/**
 * Whether the host is told the same before and after a change: held or not, to be removed or not, in which
 * power state. Going into or out of `lost` is never the same: the silent host's last report must not count after it.
 */
export function sameSpecView(from: InstanceState, fromDesired: DesiredState, to: InstanceState, toDesired: DesiredState): boolean {
  if (from === "lost" || to === "lost") return from === to && fromDesired === toDesired;
  const view = (state: InstanceState, desired: DesiredState) =>
    desired === "deleted" ? `remove:${state !== "deleted"}` : HELD_STATES.includes(state) ? `hold:${specPower(state, desired)}` : "none";
  return view(from, fromDesired) === view(to, toDesired);
}
