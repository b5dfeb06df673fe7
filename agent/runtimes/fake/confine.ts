import { accessSync, constants, lstatSync, readlinkSync, statSync } from "node:fs";
import { join } from "node:path";

/**
 * How a fake host confines a guest's exec: the command is a tenant's, and the fake runs it on the platform's own
 * machine (in `bc dev --sim`, beside the server, its data directory and its keys). Bubblewrap puts it in new
 * namespaces of every kind (user, pid, mount, network, ipc, uts, cgroup) as uid/gid 65534 with no capabilities,
 * an environment of exactly the variables given, a filesystem of the machine's programs and libraries read-only,
 * fresh /proc, /dev and /tmp, and the domain's own directory as the only writable place of the machine.
 */

/** The refusal on a machine without bubblewrap: a fake guest with no agent, so the API answers UNSUPPORTED. */
export const NO_BWRAP =
  "this fake host has no guest agent: it runs a sandbox's commands only confined by bubblewrap, and `bwrap` is not installed (install the bubblewrap package)";

/**
 * Where the system's packages put `bwrap`, or null: not looked up on the agent's PATH, since bwrap is spawned with
 * none of the agent's environment (its pid 1 inside would show it). Looked up at each exec: installing it needs
 * no restart.
 */
export function findBwrap(): string | null {
  for (const d of ["/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/usr/local/sbin"]) {
    const file = join(d, "bwrap");
    try {
      accessSync(file, constants.X_OK);
      if (statSync(file).isFile()) return file;
    } catch {
      // Not here.
    }
  }
  return null;
}

/**
 * Runs as the command inside: PWD goes (bwrap sets it; a guest's exec gets only what it is given), then fd 3
 * tells the agent "s" once the wrapper runs and, should the exec fail, the shell's status (127 not found, 126
 * not runnable); fd 3 is closed for the command itself, so its end means the command is running. (Where /bin/sh
 * is bash, a failed exec keeps fd 3 closed: the agent then sees the command exit 127 or 126 with bash's words.)
 */
const WRAPPER = `printf s >&3; trap '{ echo "$?" >&3; } 2>/dev/null' EXIT; unset PWD; exec "$@" 3>&-`;

/** The directories of the machine's programs and libraries, as they are here (merged /usr or not). */
function systemDirs(): string[] {
  const args = ["--ro-bind", "/usr", "/usr"];
  for (const d of ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]) {
    try {
      if (lstatSync(d).isSymbolicLink()) args.push("--symlink", readlinkSync(d), d);
      else args.push("--ro-bind", d, d);
    } catch {
      // Not on this machine.
    }
  }
  // Of /etc, only what programs need to load and name their alternatives: the rest may hold the machine's secrets.
  for (const f of ["/etc/ld.so.cache", "/etc/alternatives"]) args.push("--ro-bind-try", f, f);
  return args;
}

/** bwrap's arguments to run `argv` in directory `cwd` with exactly `env`; its fd 3 carries the wrapper's status. */
export function confinedArgs(cwd: string, env: Record<string, string>, argv: string[]): string[] {
  return [
    "--unshare-all",
    "--unshare-user",
    "--uid",
    "65534",
    "--gid",
    "65534",
    "--cap-drop",
    "ALL",
    // Its life is the agent's. No --new-session: the agent spawns it in a session of its own already (no terminal
    // to reach), and pause and kill signal its process group, which a new session inside would leave.
    "--die-with-parent",
    "--clearenv",
    ...Object.entries(env).flatMap(([k, v]) => ["--setenv", k, v]),
    ...systemDirs(),
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    // After /tmp: the directory may be under it, and must not be hidden by it.
    "--bind",
    cwd,
    cwd,
    "--chdir",
    cwd,
    "--",
    "/bin/sh",
    "-c",
    WRAPPER,
    "sh",
    ...argv,
  ];
}
