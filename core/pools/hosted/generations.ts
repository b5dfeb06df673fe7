import type { ChangeHook, InstanceSet } from "../../instances/changes.ts";
import { specPower } from "../../instances/decide.ts";
import type { DesiredState, InstanceState } from "../../instances/state.ts";
import { type Fragment, SQL } from "../../kernel/sql.ts";
import type { Write } from "../../kernel/write.ts";

/**
 * Spec generations: a node's generation goes up in the transaction of every change to what its agent should
 * do, and the agent echoes the generation it applied. A report older than an instance's last change says
 * nothing about that change, which is how the reconciler tells a fresh observation from a stale one.
 */

/** States in which the host should hold the domain (with the power specPower gives). */
export const HELD_STATES: readonly InstanceState[] = ["provisioning", "starting", "running", "stopped", "paused", "resizing", "rebooting", "error", "lost"];

/** The statement that bumps the nodes' generations (`ids`: a text[], or SQL for one), returning "nodeId", generation. */
export const specsBumpedSql = (ids: unknown) =>
  SQL`UPDATE nodes SET spec_generation = spec_generation + 1 WHERE id = ANY(${ids}::text[]) RETURNING id AS "nodeId", spec_generation AS generation`;

/** The nodes named, once each and in id order (the order their rows are locked in). */
export const specNodes = (nodeIds: readonly (string | null | undefined)[]) => [...new Set(nodeIds.filter((n): n is string => !!n))].sort();

/** Bump the generation of nodes whose desired set changed; the agents hear of it once the write commits. */
export async function bumpSpecs(w: Write, nodeIds: readonly (string | null | undefined)[]): Promise<{ nodeId: string; generation: number }[]> {
  const unique = specNodes(nodeIds);
  if (!unique.length) return [];
  const rows = await w.sql.query<{ nodeId: string; generation: number }>(specsBumpedSql(unique));
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

/** Columns whose change alters the instance's part of its node's spec. */
const SPEC_FIELDS: readonly (keyof InstanceSet)[] = [
  "node_id",
  "allocation_id",
  "vcpus",
  "memory_mib",
  "disk_gib",
  "gpus",
  "addresses",
  "env",
  "network_policy",
];

/**
 * The hosted pools' part of every instance change (the hosted driver's `changeHook`): the nodes it leaves and
 * joins get a new spec generation in the change's own statement, after the instance row it holds locked, so the
 * node rows are taken in the one lock order; a host report is stale for this instance until it echoes at least
 * the generation of its node after the change.
 */
export const specGenerations: ChangeHook = {
  parts({ id, inst, set, to, desired, nodeId, guard, rowNode }) {
    // A step that leaves what the host is told unchanged (provisioning → starting → running on the host's own
    // report) keeps the generation, so the report that caused it still counts and the next step follows
    // without another round trip through the agent. Anything else the host must see, and confirm, anew.
    if (nodeId === inst.nodeId && !SPEC_FIELDS.some((f) => f in set) && sameSpecView(inst.state, inst.desiredState, to, desired)) return null;
    const nodes = specNodes([inst.nodeId, nodeId]);
    // The generations' statement would run whether or not the guard held, unless it reads the node from the row.
    if (guard && nodes.length && !rowNode) throw new Error(`a guarded change must leave the host's spec as it is (${inst.state} → ${to})`);
    const bumped = rowNode
      ? specsBumpedSql(SQL`ARRAY(SELECT node_id FROM instances WHERE id = ${id} AND node_id IS NOT NULL${guard ?? SQL.empty})`)
      : nodes.length
        ? specsBumpedSql(nodes)
        : null;
    if (!bumped) return null;
    const node: Fragment = rowNode ? SQL`instances.node_id` : SQL`${nodeId}::text`;
    return {
      before: [SQL`g AS (${bumped})`],
      assignments: [SQL`spec_generation = COALESCE((SELECT generation FROM g WHERE "nodeId" = ${node}), spec_generation)`],
      returned: SQL`(SELECT json_agg(json_build_object('nodeId', "nodeId", 'generation', generation)) FROM g)`,
      applied(w, specs) {
        for (const s of (specs as { nodeId: string; generation: number }[] | null) ?? []) w.spec(s.nodeId, s.generation);
      },
    };
  },
};
