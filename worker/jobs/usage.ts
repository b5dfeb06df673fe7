import { meterUsage } from "../../core/books/usage.ts";
import type { Platform } from "../../infra/platform.ts";

/** `vps.usage`: close the metering windows that are due (core/books/usage.ts). */
export async function meter(platform: Platform): Promise<void> {
  const closed = await meterUsage((fn) => platform.write({ actor: "usage" }, fn));
  if (closed) platform.log.info("usage metered", { windows: closed });
}
