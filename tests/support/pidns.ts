import { readdirSync, readFileSync, readlinkSync } from "node:fs";

/**
 * The live processes of the machine in pid namespace `ns` (as `readlink /proc/self/ns/pid` names it inside),
 * with their state letter (`T`: stopped). A confined exec runs in a namespace of its own, and the pids it sees
 * are not the host's: this is how a test finds its processes from outside. Zombies are dead: left out.
 */
export function processesIn(ns: string): { pid: number; state: string }[] {
  const found: { pid: number; state: string }[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readlinkSync(`/proc/${name}/ns/pid`) !== ns) continue;
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
      if (state !== "Z" && state !== "X") found.push({ pid: Number(name), state });
    } catch {
      // Gone meanwhile.
    }
  }
  return found;
}
