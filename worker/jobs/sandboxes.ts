import { EXEC_OUTPUT_KEEP_MS, pruneExecOutput } from "../../core/sandboxes/exec.ts";
import { type SandboxTemplate, TEMPLATE_COLUMNS } from "../../core/sandboxes/templates.ts";
import { drainOrphanedWarm, expireSandboxes, tendPool } from "../../core/sandboxes/warm.ts";
import type { Platform } from "../../infra/platform.ts";

/**
 * `vps.sandboxes`: sandboxes past their deadline are deleted, warm instances of deleted templates drained, old
 * exec output pruned, and
 * each template's pool brought to its target — one write per template, so one pool that cannot grow (no room)
 * does not hold up the others.
 */
export async function tendSandboxes(platform: Platform): Promise<void> {
  await platform.write({ actor: "sandboxes" }, (w) => expireSandboxes(w));
  await platform.write({ actor: "sandboxes" }, (w) => drainOrphanedWarm(w));
  await platform.write({ actor: "sandboxes" }, (w) => pruneExecOutput(w, new Date(w.now.getTime() - EXEC_OUTPUT_KEEP_MS)));
  const ids = await platform.read((sql) => sql.query<{ id: string }>(`SELECT id FROM sandbox_templates ORDER BY id`));
  for (const { id } of ids) {
    const done = await platform.write({ actor: "sandboxes" }, async (w) => {
      const [t] = await w.sql.query<SandboxTemplate>(`SELECT ${TEMPLATE_COLUMNS} FROM sandbox_templates WHERE id = $1 FOR UPDATE`, [id]);
      return t ? tendPool(w, platform.admission, t) : null;
    });
    if (done?.error) platform.log.info("warm pool short of its target", { templateId: id, ...done });
  }
}

/** `vps.sandbox.expire`: one sandbox's deadline came (the sweep catches any this misses). */
export async function expireSandbox(platform: Platform, sandboxId: string): Promise<void> {
  await platform.write({ actor: "sandboxes" }, (w) => expireSandboxes(w, sandboxId));
}
