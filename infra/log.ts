import { pino } from "pino";

/**
 * The one logger (pino): JSON lines, level names as strings and an ISO `time`, on stderr unless a test hands in
 * a destination. Callers see only this interface, so the library stays an implementation detail; the agent
 * shares it through cli/agent.ts.
 */
export type Level = "debug" | "info" | "warn" | "error" | "silent";
export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  /** A logger whose every line also carries `fields` (a request id, a connection id). */
  child(fields: Record<string, unknown>): Logger;
}

/** Where lines go: anything with a `write(line)`, such as a test's array of lines. */
export interface LogDestination {
  write(line: string): void;
}

// Synchronous writes, as process.stderr.write was: a process that exits right after logging keeps its last lines.
let stderr: LogDestination | undefined;

export function logger(level: Level, base: Record<string, unknown> = {}, destination?: LogDestination): Logger {
  stderr ??= pino.destination({ dest: 2, sync: true });
  const root = pino(
    {
      level,
      base: { pid: process.pid, ...base },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    destination ?? stderr,
  );
  return wrap(root);
}

/** Methods as closures: callers pass them around unbound (`(cond ? log.info : log.warn)(…)`). */
function wrap(p: pino.Logger): Logger {
  return {
    debug: (msg, fields) => p.debug(fields ?? {}, msg),
    info: (msg, fields) => p.info(fields ?? {}, msg),
    warn: (msg, fields) => p.warn(fields ?? {}, msg),
    error: (msg, fields) => p.error(fields ?? {}, msg),
    child: (fields) => wrap(p.child(fields)),
  };
}
