import { lockInstance } from "../../core/instances/changes.ts";
import { transition } from "../../core/instances/lifecycle.ts";
import type { Platform } from "../../infra/platform.ts";

/**
 * What the reconciler does once a host confirms an instance gone: deleting, then deleted, which releases its
 * allocation, lease and quota. Tests of admission use it to close the loop before the reconciler exists.
 */
export async function confirmDeleted(platform: Platform, id: string): Promise<void> {
  await platform.write({ actor: "test:host" }, async (w) => {
    let inst = await lockInstance(w, null, id);
    if (inst.state !== "deleting") inst = await transition(w, inst, "deleting", "host:deleting");
    await transition(w, inst, "deleted", "host:gone");
  });
}

/** Move an instance along a path of states, as host reports would. */
export async function walk(platform: Platform, id: string, states: string[]): Promise<void> {
  for (const to of states) {
    await platform.write({ actor: "test:host" }, async (w) => transition(w, await lockInstance(w, null, id), to as never, `host:${to}`));
  }
}
