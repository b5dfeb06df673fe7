import { pruneHistory } from "../../core/books/retention.ts";
import type { Platform } from "../../infra/platform.ts";

/** `vps.retention`: delete history older than the configured retention (core/books/retention.ts). */
export async function prune(platform: Platform): Promise<void> {
  const pruned = await platform.read((sql) => pruneHistory(sql, platform.now(), platform.config.retention));
  if (pruned.events || pruned.audit || pruned.commands) platform.log.info("history pruned", { ...pruned });
}
