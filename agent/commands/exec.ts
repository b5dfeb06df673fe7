import { ExecOutput } from "./exec-output.ts";
import { type CommandHandler, failed, type Outcome, succeeded } from "./handler.ts";

/** Why an exec found running in a journal at start is not run again: its output so far is lost. */
export const EXEC_INTERRUPTED = "the agent restarted while the command ran";
/** Thrown into an exec the runner stops waiting for because the agent is leaving. */
const LEAVING = new Error("the agent is leaving");

/**
 * An exec runs beside convergence, not under its instance's lock: it can last an hour, and holding the lock would
 * stop convergence of its instance for that long (a stop or delete of the sandbox would wait for the command) and
 * run one instance's execs one after another. It only waits for the commands ahead of it on the instance (a
 * snapshot keeps the domain off for a moment) before it starts. Its output goes to the server as it comes, all of
 * it before the final report; it is never run twice (running a command twice is not harmless).
 */
export const execHandler: CommandHandler<"instance.exec"> = {
  interrupted: EXEC_INTERRUPTED,
  async run(cmd, ctx) {
    const { instanceId, outputBytes, ...req } = cmd.args;
    // Taken and given back at once: only the wait for a snapshot or restore already holding it matters.
    (await ctx.locks.acquire(instanceId, { quiet: true })).release();
    if (ctx.leaving.aborted) return null;
    const output = new ExecOutput({
      attempt: (chunks) => ctx.sendOutput(cmd.id, chunks),
      backoff: (failures) => ctx.backoff(failures),
      stop: ctx.leaving,
      onRetry: (e) => ctx.log("exec output not delivered, will retry", { id: cmd.id, err: String(e) }),
      maxBytes: outputBytes,
    });
    let outcome: Outcome;
    try {
      outcome = succeeded(
        await unlessLeaving(
          ctx.leaving,
          ctx.runtime.exec(instanceId, req, (stream, data) => output.push(stream, data)),
        ),
      );
    } catch (e) {
      if (e === LEAVING) return null;
      // The output before the refusal still goes first: it may say why.
      outcome = failed(e);
    }
    try {
      await output.end();
    } catch {
      return null; // leaving: left running in the journal
    }
    return outcome;
  },
};

/** `work`'s outcome, or LEAVING as soon as the agent leaves (the work goes on, unobserved). */
function unlessLeaving<T>(signal: AbortSignal, work: Promise<T>): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const leave = () => reject(LEAVING);
    if (signal.aborted) leave();
    signal.addEventListener("abort", leave, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener("abort", leave));
  });
}
