import { open, realpath } from "node:fs/promises";
import { isAbsolute, relative, resolve, sep } from "node:path";
import { settingNames } from "./config.ts";

/**
 * The fence around `env:` and `file:` credential references. An operator's API caller chooses the reference
 * and the worker sends what it resolves to as a bearer token, so a reference may name only what the deployment
 * set aside for credentials: variables with its prefix, files inside its secrets directory. Never one of the
 * deployment's own settings, nor anything in its data dir (the seal key, the embedded database), whatever the
 * prefix and the directory say. Checked when an account is created (`refusal`) and again, with every link
 * followed, each time the broker reads (`readFenced`): a row stored before the rule, or a symlink placed
 * since, is refused there.
 */
export interface SecretRefPolicy {
  /** `env:` names must start with this (empty: any name but the settings). */
  envPrefix: string;
  /** `file:` paths must be inside this directory; unset: `file:` references are refused. */
  dir?: string | undefined;
  /** The deployment's data dir: never readable through a reference. */
  dataDir: string;
}

/** A credential file is a token or a key: anything larger is not one. */
const MAX_BYTES = 64 * 1024;

const inside = (path: string, dir: string) => {
  const r = relative(dir, path);
  return r !== "" && r !== ".." && !r.startsWith(`..${sep}`) && !isAbsolute(r);
};

/** Why an env: name is refused, or null. */
function envRefusal(name: string, p: SecretRefPolicy): string | null {
  if (settingNames.has(name)) return "env: references may not name one of the deployment's own settings";
  if (!name.startsWith(p.envPrefix)) return `env: references must name a variable starting with ${p.envPrefix} (vps.secretRefs.envPrefix)`;
  return null;
}

/** Why a path (as given, or with its links followed) is refused, or null. */
async function pathRefusal(path: string, p: SecretRefPolicy, followed: boolean): Promise<string | null> {
  if (!p.dir) return "file: references are off in this deployment (set vps.secretRefs.dir)";
  const dirs = [resolve(p.dir), await realpath(p.dir).catch(() => resolve(p.dir as string))];
  const data = [resolve(p.dataDir), await realpath(p.dataDir).catch(() => resolve(p.dataDir))];
  const outside = `file: references must name a file inside ${p.dir} (vps.secretRefs.dir)`;
  if (!followed && path.split("/").some((part) => part === ".." || part === ".")) return outside;
  if (!dirs.some((d) => inside(path, d))) return outside;
  if (data.some((d) => d === path || inside(path, d))) return "file: references may not name anything in the deployment's data dir";
  return null;
}

/** Why a reference is refused by the deployment's fence, or null (schemes other than env: and file: pass). */
export async function refusal(ref: string, p: SecretRefPolicy): Promise<string | null> {
  if (ref.startsWith("env:")) return envRefusal(ref.slice(4), p);
  if (!ref.startsWith("file:")) return null;
  const path = ref.slice(5);
  const lexical = await pathRefusal(path, p, false);
  if (lexical) return lexical;
  // A file that exists already is judged by where its links lead; one placed later is judged when read.
  const real = await realpath(path).catch(() => null);
  return real ? pathRefusal(real, p, true) : null;
}

/** Thrown by readFenced: `message` is the reason, never the file's contents; `fenced` when the fence refused it. */
export class RefusedReference extends Error {
  constructor(
    message: string,
    readonly fenced: boolean,
  ) {
    super(message);
  }
}

/**
 * A file: reference's contents (without a trailing newline), read from where its links lead only if that is
 * inside the fence. Errors name the reason or the system's code, never the contents.
 */
export async function readFenced(path: string, p: SecretRefPolicy): Promise<string> {
  const why = await pathRefusal(path, p, false);
  if (why) throw new RefusedReference(why, true);
  const real = await realpath(path).catch((e: NodeJS.ErrnoException) => {
    throw new RefusedReference(`cannot be read (${e.code ?? "error"})`, false);
  });
  const after = await pathRefusal(real, p, true);
  if (after) throw new RefusedReference(after, true);
  // The checked path is opened, not the reference: a link in it cannot be repointed between check and read.
  const handle = await open(real, "r").catch((e: NodeJS.ErrnoException) => {
    throw new RefusedReference(`cannot be read (${e.code ?? "error"})`, false);
  });
  try {
    const stat = await handle.stat();
    if (!stat.isFile()) throw new RefusedReference("is not a regular file", false);
    if (stat.size > MAX_BYTES) throw new RefusedReference(`is larger than ${MAX_BYTES} bytes`, false);
    const { buffer, bytesRead } = await handle.read(Buffer.alloc(MAX_BYTES), 0, MAX_BYTES, 0);
    return buffer
      .subarray(0, bytesRead)
      .toString("utf8")
      .replace(/\r?\n$/, "");
  } finally {
    await handle.close();
  }
}
