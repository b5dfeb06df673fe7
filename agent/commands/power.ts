import { RuntimeError } from "../runtimes/runtime.ts";
import { type CommandHandler, failed, type Outcome, succeeded } from "./handler.ts";

/**
 * Pause and resume (a warm claim waits on a resume) take the shortest path: no journal and no acknowledgement
 * (contracts/commands.ts), since running one twice is harmless (the runtime's pause and resume are idempotent,
 * and the server sends an unfinished one again after a restart) and it is over before either would arrive. Its
 * instance is taken at once, before anything is awaited, so the spec change that comes with it finds it held and
 * the converger leaves it to this command instead of listing the host's domains ahead of it.
 */
export const powerHandler: CommandHandler<"instance.pause" | "instance.resume"> = {
  async run(cmd, ctx) {
    // Quiet: the command's own report settles the instance's state, and the spec that says the same follows.
    const lease = await ctx.locks.acquire(cmd.args.instanceId, { quiet: true });
    if (cmd.args.generation !== undefined) ctx.onPower?.(cmd.args.instanceId, cmd.args.generation);
    let outcome: Outcome;
    try {
      if (ctx.now() > Date.parse(cmd.deadline)) throw new RuntimeError(`not started: received after its deadline ${cmd.deadline}`, false, "expired");
      if (cmd.kind === "instance.pause") await ctx.runtime.pause(cmd.args.instanceId);
      else await ctx.runtime.resume(cmd.args.instanceId);
      outcome = succeeded({});
    } catch (e) {
      outcome = failed(e);
    } finally {
      lease.release();
    }
    return outcome;
  },
  // The report names the command's kind and instance: the server settles it in the message that records it.
  report: (cmd) => ({ power: { kind: cmd.kind, instanceId: cmd.args.instanceId } }),
  passesWait: true,
};
