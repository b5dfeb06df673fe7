import { lockInstance, transition } from "../../core/instances/changes.ts";
import type { Platform } from "../../infra/platform.ts";

/**
 * What the reconciler does once a host confirms an instance gone: deleting, then deleted, which releases its
 * allocation, lease and quota. Tests of admission use it to close the loop before the reconciler exists.
 */
export async function confirmDeleted(platform: Platform, id: string): Promise<void> {
  await platform.write(async (sql, emit) => {
    let inst = await lockInstance(sql, null, id);
    const ctx = { actor: "test:host", now: platform.now() };
    if (inst.state !== "deleting") {
      const c = await transition(sql, inst, "deleting", "host:deleting", ctx);
      emit(c);
      inst = c.instance;
    }
    emit(await transition(sql, inst, "deleted", "host:gone", ctx));
  });
}

/** Move an instance along a path of states, as host reports would. */
export async function walk(platform: Platform, id: string, states: string[]): Promise<void> {
  for (const to of states) {
    await platform.write(async (sql, emit) => {
      const inst = await lockInstance(sql, null, id);
      emit(await transition(sql, inst, to as never, `host:${to}`, { actor: "test:host", now: platform.now() }));
    });
  }
}
