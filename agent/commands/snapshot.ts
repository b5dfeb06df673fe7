import type { Runtime } from "../runtimes/runtime.ts";
import { type CommandHandler, failed, type Job, type Outcome, succeeded } from "./handler.ts";

/**
 * Snapshot and restore hold their instance's lock while they run, and are run again when the agent died in one
 * (the runtime's operations are idempotent by snapshot id). Reports show the domain as it was when the command
 * began: on a run after a crash, as the journal remembers it (the domain itself may be halfway: a save leaves it
 * off), pinned before anything else can look.
 */
function underLock(
  op: (runtime: Runtime, args: { instanceId: string; snapshotId: string }) => Promise<Record<string, unknown>>,
): CommandHandler<"instance.snapshot" | "instance.restore"> {
  return {
    async run(cmd, ctx, job) {
      // The contracts' table journals both kinds: the runner always hands their journal.
      const { journal, taken, pin } = job as Job;
      const lease = await ctx.locks.acquire(cmd.args.instanceId);
      if (journal.pinned) lease.pin(journal.pinned);
      taken();
      let outcome: Outcome;
      try {
        if (!journal.pinned) {
          const before = (await ctx.runtime.list()).find((d) => d.id === cmd.args.instanceId);
          if (before) {
            lease.pin(before);
            await pin(before);
          }
        }
        outcome = succeeded(await op(ctx.runtime, cmd.args));
      } catch (e) {
        outcome = failed(e);
      } finally {
        lease.release();
      }
      return outcome;
    },
  };
}

export const snapshotHandler = underLock(async (runtime, { instanceId, snapshotId }) => {
  const { sizeBytes } = await runtime.snapshot(instanceId, snapshotId);
  return { sizeBytes };
});

export const restoreHandler = underLock(async (runtime, { instanceId, snapshotId }) => {
  await runtime.restore(instanceId, snapshotId);
  return {};
});
