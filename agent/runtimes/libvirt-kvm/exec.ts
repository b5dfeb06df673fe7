import { execFile } from "node:child_process";
import { RuntimeError } from "../runtime.ts";

/** Run a host tool with an argument list (never a shell); its stderr becomes the error a report carries. */
export function run(cmd: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { maxBuffer: 16 * 2 ** 20 }, (err, stdout, stderr) => {
      if (err) reject(new RuntimeError(`${cmd} ${args[0] ?? ""}: ${(stderr || err.message).trim()}`, true));
      else resolve(stdout);
    });
  });
}
