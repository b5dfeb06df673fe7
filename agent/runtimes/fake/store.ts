import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { RefusalCode } from "../../../contracts/commands.ts";
import type { NetworkPolicy } from "../../../contracts/host.ts";
import { PRIVATE_FILE } from "../files.ts";
import { type DomainStatus, RuntimeError } from "../runtime.ts";

/** The fake's files: its domain records, how they are written, and the failures and guest events tests inject. */

export const fakeOps = ["create", "start", "stop", "pause", "resume", "remove", "resize", "snapshot", "restore", "exec"] as const;
export type FakeOp = (typeof fakeOps)[number];

/** A refusal the host will make: every time, or the next `times` calls. */
export interface InjectedFailure {
  error: string;
  retryable: boolean;
  /** What the host's report says of it (contracts/commands.ts, refusalCodes); `internal` unless given. */
  code?: RefusalCode;
  times?: number;
}

export type PowerState = DomainStatus["state"];

export interface DomainRecord {
  id: string;
  state: PowerState;
  shape: DomainStatus["shape"];
  mac: string;
  image: { url: string; sha256: string };
  createdAt: string;
  /** What the simulated guest is seen to use, as a runtime learns it (tests set it: setDomainAddresses). */
  addresses?: string[];
  /** Set while a snapshot has the domain saved (off): the snapshot and the power state it had. */
  saving?: { snapshotId: string; power: PowerState };
  /** The spec's, as at create: what execs get (absent in records written before they were kept). */
  env?: Record<string, string>;
  network?: NetworkPolicy;
  /** Made from another domain's snapshot rather than from the image. */
  fromSnapshot?: { instanceId: string; snapshotId: string };
}

// Ids become file names: anything else could climb out of the state directory.
export const safeId = /^[A-Za-z0-9][A-Za-z0-9_-]*$/;

let tmpCounter = 0;
// A rename within one directory is atomic: a reader (or a restarted agent) sees the old file or the new one,
// never half of either. Temp names end in `.tmp` so `list()` never mistakes one for a domain.
export const tmpName = (path: string) => `${path}.${process.pid}.${++tmpCounter}.tmp`;

export async function writeAtomic(path: string, data: string): Promise<void> {
  const tmp = tmpName(path);
  await writeFile(tmp, data, { mode: PRIVATE_FILE });
  await rename(tmp, path);
}

function writeAtomicSync(path: string, data: string): void {
  const tmp = tmpName(path);
  writeFileSync(tmp, data, { mode: PRIVATE_FILE });
  renameSync(tmp, path);
}

export const isMissing = (err: unknown) => (err as NodeJS.ErrnoException).code === "ENOENT";

const injectPath = (dir: string) => join(dir, "inject.json");

function readInjections(dir: string): Partial<Record<FakeOp, InjectedFailure>> {
  try {
    return JSON.parse(readFileSync(injectPath(dir), "utf8"));
  } catch (err) {
    if (isMissing(err)) return {};
    throw err;
  }
}

function writeInjections(dir: string, all: Partial<Record<FakeOp, InjectedFailure>>): void {
  if (Object.keys(all).length === 0) rmSync(injectPath(dir), { force: true });
  else writeAtomicSync(injectPath(dir), `${JSON.stringify(all, null, 2)}\n`);
}

// The injection file is handled with synchronous calls on purpose: read, decrement and rewrite happen without
// yielding, so two operations in flight in this process cannot both spend the last `times`.

/** Make `op` fail on the runtime using `dir` (merged with the failures already injected there). */
export function injectFailure(dir: string, op: FakeOp, failure: InjectedFailure): void {
  if (failure.times !== undefined && !(Number.isInteger(failure.times) && failure.times > 0)) {
    throw new Error(`times must be a positive integer, got ${failure.times}`);
  }
  mkdirSync(dir, { recursive: true });
  writeInjections(dir, { ...readInjections(dir), [op]: failure });
}

/** Forget every injected failure for the runtime using `dir`. */
export function clearFailures(dir: string): void {
  rmSync(injectPath(dir), { force: true });
}

/**
 * What happens to a simulated guest by itself, on the host using `dir`: it crashes (as libvirt shows a guest
 * that panicked or whose QEMU died), or its runtime learns the addresses it uses. For tests, on a domain no
 * operation is acting on: the file is rewritten outside the runtime's own queue.
 */
export function crashDomain(dir: string, id: string): void {
  editDomain(dir, id, (d) => ({ ...d, state: "crashed" }));
}

export function setDomainAddresses(dir: string, id: string, addresses: string[]): void {
  editDomain(dir, id, (d) => ({ ...d, addresses }));
}

function editDomain(dir: string, id: string, edit: (d: DomainRecord) => DomainRecord): void {
  if (!safeId.test(id)) throw new Error(`invalid domain name '${id}'`);
  const path = join(dir, "domains", `${id}.json`);
  writeAtomicSync(path, `${JSON.stringify(edit(JSON.parse(readFileSync(path, "utf8"))), null, 2)}\n`);
}

export function consumeInjected(dir: string, op: FakeOp): void {
  const all = readInjections(dir);
  const failure = all[op];
  if (!failure) return;
  if (failure.times !== undefined) {
    if (failure.times > 1) all[op] = { ...failure, times: failure.times - 1 };
    else delete all[op];
    writeInjections(dir, all);
  }
  throw new RuntimeError(failure.error, failure.retryable, failure.code);
}
