/** JSON lines on stderr: one object per event, machine-readable, no dependency. */
export type Level = "debug" | "info" | "warn" | "error" | "silent";
export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

const rank: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 };

export function logger(level: Level, base: Record<string, unknown> = {}): Logger {
  const at = (l: Exclude<Level, "silent">) => (msg: string, fields?: Record<string, unknown>) => {
    if (rank[l] < rank[level]) return;
    process.stderr.write(`${JSON.stringify({ t: new Date().toISOString(), level: l, msg, ...base, ...fields })}\n`);
  };
  return { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}
