import { isIP } from "node:net";
import { AppError } from "../../../contracts/errors.ts";
import type { Capacity, StatusReport } from "../../../contracts/host.ts";
import { DEFAULT_RUNTIME } from "../../../contracts/runtimes.ts";
import { lockInstance, writeChange } from "../../instances/changes.ts";
import type { Write } from "../../kernel/write.ts";

/**
 * A host's StatusReport: record what it says and wake the instances it tells something new about. An
 * observation is written only when it says something new, and counts for the reconciler once the report's
 * generation has caught up with the instance's last change (generations.ts). A report that changes nothing
 * but the node's liveness (a heartbeat) writes no audit row: liveness is not a change anyone acted on.
 * A host that lacks its pool's runtime refuses the pool's spec: the node shows `refusing`, and nothing it
 * says of domains is taken as news of the pool's instances (reconcile.ts marks them). `passesHereUpTo`: the
 * caller reconciles the instances the report woke itself, right after the commit, when there are at most that
 * many; `passesHere` names them (none when there are more: those get jobs).
 */
export async function recordReport(
  w: Write,
  nodeId: string,
  report: StatusReport,
  opts: { passesHereUpTo?: number } = {},
): Promise<{ generation: number; passesHere: string[] }> {
  const { sql, now } = w;
  // Lock order, everywhere: instance rows before node rows (an instance change bumps its node's generation).
  // So the node row is read here without a lock and written last.
  const reported = report.instances.map((i) => ({ ...i, shape: i.shape ?? null }));
  // What the host says of its domains, in one statement with the look at its node: observations that say
  // something new, domains gone (absent), orphans found and adopted, and the addresses of the instances it names
  // (for recordAddresses). The two updates touch apart rows (named, not named). Domains no instance on this node
  // owns are orphans; one that is owned again, or gone, is not. A host that lacks its pool's runtime refuses the
  // pool's spec: its domains are another runtime's business, so nothing it names is news, nothing is absent for
  // it, and its orphans stay as they were. A node that is gone changes nothing.
  const [said] = await sql.query<{
    node: { wasLost: boolean; state: string; runtime: string; hasGpus: boolean; refuses: boolean } | null;
    changed: string[];
    vanished: string[];
    orphaned: number;
    adopted: number;
    addressed: { id: string; addresses: string[] }[];
  }>(
    `WITH node AS (
       SELECT n.lost_at IS NOT NULL AS "wasLost", n.state, COALESCE(p.runtime, '${DEFAULT_RUNTIME}') AS runtime,
              EXISTS (SELECT 1 FROM node_gpus g WHERE g.node_id = n.id) AS "hasGpus",
              ($6::text[] IS NOT NULL AND NOT (COALESCE(p.runtime, '${DEFAULT_RUNTIME}') = ANY($6::text[]))) AS refuses
         FROM nodes n JOIN pools p ON p.id = n.pool_id WHERE n.id = $1 AND n.gone_at IS NULL),
     heard AS (SELECT 1 FROM node WHERE NOT refuses),
     changed AS (
       UPDATE instances i SET observed_state = r.state, observed_error = r.error, observed_retryable = r.retryable,
              observed_shape = r.shape, observed_generation = $2, observed_at = $3
         FROM jsonb_to_recordset($4::jsonb) AS r(id text, state text, error text, retryable boolean, shape jsonb)
        WHERE EXISTS (SELECT FROM heard) AND i.id = r.id AND i.node_id = $1 AND i.state <> 'deleted'
          AND (i.observed_state IS DISTINCT FROM r.state OR i.observed_error IS DISTINCT FROM r.error
               OR i.observed_shape IS DISTINCT FROM r.shape OR (i.observed_generation < i.spec_generation AND $2 >= i.spec_generation))
        RETURNING i.id),
     vanished AS (
       UPDATE instances SET observed_state = 'absent', observed_error = NULL, observed_generation = $2, observed_at = $3
        WHERE EXISTS (SELECT FROM heard) AND node_id = $1 AND state <> 'deleted' AND NOT (id = ANY($5::text[]))
          AND (observed_state IS DISTINCT FROM 'absent' OR (observed_generation < spec_generation AND $2 >= spec_generation))
        RETURNING id),
     added AS (
       INSERT INTO orphans (node_id, domain_id, first_seen_at)
       SELECT $1, d, $3 FROM unnest($5::text[]) AS d
        WHERE EXISTS (SELECT FROM heard) AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = d AND i.node_id = $1 AND i.state <> 'deleted')
       ON CONFLICT DO NOTHING RETURNING domain_id),
     removed AS (
       DELETE FROM orphans o WHERE EXISTS (SELECT FROM heard) AND o.node_id = $1
          AND (NOT (o.domain_id = ANY($5::text[])) OR EXISTS (SELECT 1 FROM instances i WHERE i.id = o.domain_id AND i.node_id = $1 AND i.state <> 'deleted'))
       RETURNING domain_id)
     SELECT (SELECT to_jsonb(node) FROM node) AS node,
            COALESCE((SELECT array_agg(id) FROM changed), '{}') AS changed, COALESCE((SELECT array_agg(id) FROM vanished), '{}') AS vanished,
            (SELECT count(*)::int FROM added) AS orphaned, (SELECT count(*)::int FROM removed) AS adopted,
            COALESCE((SELECT jsonb_agg(jsonb_build_object('id', id, 'addresses', addresses)) FROM instances
                       WHERE EXISTS (SELECT FROM heard) AND node_id = $1 AND id = ANY($5::text[]) AND state NOT IN ('deleting', 'deleted')
                         AND cardinality(addresses) > 0), '[]') AS addressed`,
    [nodeId, report.generation, now, JSON.stringify(reported), reported.map((i) => i.id), report.runtimes ?? null],
  );
  const node = said?.node;
  if (!node) throw new AppError("UNAUTHENTICATED", `node ${nodeId} is gone`);
  const refuses = node.refuses;
  const seen = refuses ? [] : reported;
  const changed = said?.changed ?? [];
  const vanished = said?.vanished ?? [];
  const readdressed = await recordAddresses(w, nodeId, seen, said?.addressed ?? []);
  const orphaned = said?.orphaned ?? 0;
  const adopted = said?.adopted ?? 0;
  // An operator's cordon stands: only a ready node starts refusing, and only a refusing one is ready again.
  // The capacity the host reports, never below what is already allocated on it (placed instances keep their
  // claim), goes in the same statement; `resized` compares it with the row as it was.
  const flip = refuses && node.state === "ready" ? "refusing" : !refuses && node.state === "refusing" ? "ready" : null;
  const cap = report.capacity;
  const [updated] = await sql.query<{ generation: number; state: string; resized: boolean }>(
    `UPDATE nodes n SET last_report_at = $2, reported_generation = $3, lost_at = NULL,
            state = CASE WHEN $4::text IS NOT NULL AND n.state = $5 THEN $4 ELSE n.state END,
            cap_vcpus = GREATEST($6, n.alloc_vcpus), cap_memory_mib = GREATEST($7, n.alloc_memory_mib), cap_disk_gib = GREATEST($8, n.alloc_disk_gib)
       FROM nodes old WHERE n.id = $1 AND old.id = n.id
     RETURNING n.spec_generation AS generation, n.state,
               (old.cap_vcpus, old.cap_memory_mib, old.cap_disk_gib) IS DISTINCT FROM (n.cap_vcpus, n.cap_memory_mib, n.cap_disk_gib) AS resized`,
    [nodeId, now, report.generation, flip, node.state, cap.vcpus, cap.memoryMib, cap.diskGib],
  );
  const flipped = flip !== null && updated?.state === flip;
  const gpusChanged = node.hasGpus || cap.gpus.length > 0 ? await applyReportedGpus(w, nodeId, cap) : false;
  const capacityChanged = (updated?.resized ?? false) || gpusChanged;
  const wake =
    node.wasLost || flipped
      ? (await sql.query<{ id: string }>(`SELECT id FROM instances WHERE node_id = $1 AND state <> 'deleted'`, [nodeId])).map((r) => r.id)
      : [...changed, ...vanished];
  // Instances whose passes the caller takes itself once this commits (as many as it said it would) get no job:
  // one would only queue on the row behind that pass and find nothing left. The sweep is the net if the
  // caller dies in between.
  const passesHere = wake.length <= (opts.passesHereUpTo ?? 0) ? wake : [];
  for (const id of wake) {
    if (passesHere.length) w.settle(id);
    else w.wake(id);
  }
  if (changed.length || vanished.length || orphaned || adopted || capacityChanged || node.wasLost || flipped || readdressed) {
    w.audit({
      targetId: nodeId,
      details: {
        generation: report.generation,
        observed: changed.length + vanished.length,
        orphans: orphaned - adopted,
        capacityChanged,
        recovered: node.wasLost,
        ...(flipped ? { state: flip, runtimes: report.runtimes } : {}),
        ...(readdressed ? { readdressed } : {}),
      },
    });
  } else w.unchanged();
  return { generation: updated?.generation ?? 0, passesHere };
}

const MAX_REPORTED_ADDRESSES = 16;

/**
 * An instance's addresses are its lease (always first: the spec gives it to the guest) and then what its
 * runtime reports it uses. A change is an instance change like any other (an event, a new version), so
 * watchers see it. `candidates`: the reported instances of this node that hold a lease, as the report's
 * statement read them. Returns how many instances changed.
 */
async function recordAddresses(
  w: Write,
  nodeId: string,
  seen: { id: string; addresses: string[] }[],
  candidates: { id: string; addresses: string[] }[],
): Promise<number> {
  const reported = new Map(seen.map((i) => [i.id, [...new Set(i.addresses.filter((a) => isIP(a) !== 0))].slice(0, MAX_REPORTED_ADDRESSES)]));
  const merged = (lease: string, id: string) => [lease, ...(reported.get(id) ?? []).filter((a) => a !== lease)];
  const differ = (id: string, addresses: string[]) => JSON.stringify(merged(addresses[0] as string, id)) !== JSON.stringify(addresses);
  const stale = candidates.filter((c) => differ(c.id, c.addresses)).map((c) => c.id);
  // Every row locked before the first change touches the node's row (the lock order above).
  const locked = [];
  for (const id of stale.sort()) locked.push(await lockInstance(w, null, id));
  let n = 0;
  for (const inst of locked) {
    if (!differ(inst.id, inst.addresses) || inst.nodeId !== nodeId || inst.state === "deleting" || inst.state === "deleted") continue;
    await writeChange(w, inst, { addresses: merged(inst.addresses[0] as string, inst.id) }, "host:addresses");
    n++;
  }
  return n;
}

/** The GPUs the host says it has (asked only of a node that has or reports some). Returns whether they changed. */
async function applyReportedGpus(w: Write, nodeId: string, cap: Capacity): Promise<boolean> {
  const { sql } = w;
  const have = await sql.query<{ id: string; model: string; pci: string | null; held: boolean; index: number }>(
    `SELECT id, model, pci_address AS pci, allocation_id IS NOT NULL AS held, index FROM node_gpus WHERE node_id = $1 ORDER BY index`,
    [nodeId],
  );
  // GPUs are known by model and PCI address here (an operator's count-based edit is nodes.ts's rule).
  const key = (g: { model: string; pci: string | null }) => `${g.model}@${g.pci ?? ""}`;
  const want = cap.gpus.map((g) => ({ model: g.model, pci: g.pciAddress }));
  const missing = want.filter((w) => !have.some((h) => key(h) === key(w)));
  const extra = have.filter((h) => !h.held && !want.some((w) => key(w) === key(h)));
  if (extra.length) await sql.query(`DELETE FROM node_gpus WHERE id = ANY($1::text[])`, [extra.map((g) => g.id)]);
  let next = have.reduce((m, g) => Math.max(m, g.index + 1), 0);
  for (const g of missing) {
    await sql.query(`INSERT INTO node_gpus (id, node_id, model, index, pci_address) VALUES ($1, $2, $3, $4, $5)`, [
      w.ids("gpu"),
      nodeId,
      g.model,
      next++,
      g.pci,
    ]);
  }
  return extra.length > 0 || missing.length > 0;
}
