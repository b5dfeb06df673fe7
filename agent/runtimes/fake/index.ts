import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { copyFile, mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { Capacity } from "../../../contracts/host.ts";
import { bytesIn, PRIVATE_DIR, PRIVATE_FILE, sweepTemporaries } from "../files.ts";
import { type DomainStatus, type Runtime, RuntimeError } from "../runtime.ts";
import { renderSeed } from "../seed.ts";

/**
 * The `fake` runtime: a hypervisor made of files, for `bc agent --runtime fake`, `bc dev --sim N` and tests.
 * Everything lives under one directory, so a restarted agent on the same directory finds its domains again,
 * and several fakes can share one process as long as each has its own directory.
 */

export const fakeOps = ["create", "start", "stop", "pause", "resume", "remove", "resize", "snapshot", "restore"] as const;
export type FakeOp = (typeof fakeOps)[number];

export interface FakeOptions {
  /** State directory, created if missing. */
  dir: string;
  /** Default: 16 vCPU, 65536 MiB, 1000 GiB, no GPUs. */
  capacity?: Capacity;
  /** Milliseconds each operation waits before it takes effect (default 0), so callers can see it in flight. */
  delays?: Partial<Record<FakeOp, number>>;
  /**
   * The pool runtimes it stands in for. Default: `fake` and `libvirt-kvm`, so simulated hosts join pools made
   * with the default runtime (tests, `bc dev --sim`) as the hosts they simulate would.
   */
  serves?: string[];
}

/** A refusal the host will make: every time, or the next `times` calls. */
export interface InjectedFailure {
  error: string;
  retryable: boolean;
  times?: number;
}

type PowerState = DomainStatus["state"];

interface DomainRecord {
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
}

const defaultCapacity: Capacity = { vcpus: 16, memoryMib: 65536, diskGib: 1000, gpus: [] };

// Ids and digests become file names: anything else could climb out of the state directory.
const safeId = /^[A-Za-z0-9][A-Za-z0-9_-]*$/;
const sha256Hex = /^[0-9a-f]{64}$/;

// Power moves as libvirt allows them: the target state itself is a no-op, the listed sources move, the rest
// is an invalid request (libvirt will not suspend an inactive domain, nor start a paused one).
const moves: Record<"start" | "stop" | "pause" | "resume", { to: PowerState; from: PowerState[] }> = {
  start: { to: "running", from: ["stopped", "crashed"] },
  stop: { to: "stopped", from: ["running", "paused", "crashed"] },
  pause: { to: "paused", from: ["running"] },
  resume: { to: "running", from: ["paused"] },
};

let tmpCounter = 0;
// A rename within one directory is atomic: a reader (or a restarted agent) sees the old file or the new one,
// never half of either. Temp names end in `.tmp` so `list()` never mistakes one for a domain.
const tmpName = (path: string) => `${path}.${process.pid}.${++tmpCounter}.tmp`;

async function writeAtomic(path: string, data: string): Promise<void> {
  const tmp = tmpName(path);
  await writeFile(tmp, data, { mode: PRIVATE_FILE });
  await rename(tmp, path);
}

function writeAtomicSync(path: string, data: string): void {
  const tmp = tmpName(path);
  writeFileSync(tmp, data, { mode: PRIVATE_FILE });
  renameSync(tmp, path);
}

const isMissing = (err: unknown) => (err as NodeJS.ErrnoException).code === "ENOENT";

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

function consumeInjected(dir: string, op: FakeOp): void {
  const all = readInjections(dir);
  const failure = all[op];
  if (!failure) return;
  if (failure.times !== undefined) {
    if (failure.times > 1) all[op] = { ...failure, times: failure.times - 1 };
    else delete all[op];
    writeInjections(dir, all);
  }
  throw new RuntimeError(failure.error, failure.retryable);
}

export function createFakeRuntime(opts: FakeOptions): Runtime {
  const { dir } = opts;
  const cap = opts.capacity ?? defaultCapacity;
  const paths = {
    domain: (id: string) => join(dir, "domains", `${id}.json`),
    overlay: (id: string) => join(dir, "overlays", `${id}.qcow2`),
    seed: (id: string) => join(dir, "seeds", `${id}.iso`),
    image: (sha256: string) => join(dir, "images", sha256),
    snapshots: (id: string) => join(dir, "snapshots", id),
    snapshot: (id: string, snapshotId: string) => {
      if (!safeId.test(snapshotId)) throw new RuntimeError(`invalid snapshot name '${snapshotId}'`, false);
      return join(dir, "snapshots", id, snapshotId);
    },
  };
  for (const sub of ["domains", "overlays", "seeds", "images", "snapshots"]) mkdirSync(join(dir, sub), { recursive: true, mode: PRIVATE_DIR });
  sweepTemporaries(dir);

  // One promise chain per domain: an operation starts only once the previous one on that domain settled.
  const chains = new Map<string, Promise<unknown>>();

  function serial<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const prev = chains.get(id) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    chains.set(id, next);
    // Drop the chain when it is the last one, without creating a promise that could reject unobserved.
    const done = () => {
      if (chains.get(id) === next) chains.delete(id);
    };
    next.then(done, done);
    return next;
  }

  const delay = async (name: FakeOp) => {
    const ms = opts.delays?.[name] ?? 0;
    if (ms > 0) await sleep(ms);
  };

  // A snapshot spends its delay inside, while the domain is saved, as a real save spends its time.
  async function op<T>(name: FakeOp, id: string, fn: () => Promise<T>): Promise<T> {
    if (!safeId.test(id)) throw new RuntimeError(`invalid domain name '${id}'`, false);
    return serial(id, async () => {
      if (name !== "snapshot") await delay(name);
      consumeInjected(dir, name);
      return fn();
    });
  }

  async function load(id: string): Promise<DomainRecord> {
    try {
      return JSON.parse(await readFile(paths.domain(id), "utf8"));
    } catch (err) {
      if (isMissing(err)) throw new RuntimeError(`Domain not found: no domain with matching name '${id}'`, false);
      throw err;
    }
  }

  const save = (d: DomainRecord) => writeAtomic(paths.domain(d.id), `${JSON.stringify(d, null, 2)}\n`);
  const overlay = (sha256: string, diskGib: number) =>
    `${JSON.stringify({ format: "qcow2", backingFile: `../images/${sha256}`, backingFormat: "qcow2", backingSha256: sha256, virtualSizeGib: diskGib })}\n`;

  /** The domain's record and overlay as `snapshotId`: written aside, renamed into place, so a snapshot dir is whole. */
  async function capture(record: DomainRecord, snapshotId: string): Promise<void> {
    const final = paths.snapshot(record.id, snapshotId);
    const partial = `${final}.partial`;
    await rm(partial, { recursive: true, force: true });
    await mkdir(partial, { recursive: true });
    const { saving: _, ...saved } = record;
    await writeFile(join(partial, "domain.json"), `${JSON.stringify(saved, null, 2)}\n`);
    await copyFile(paths.overlay(record.id), join(partial, "overlay.qcow2"));
    await rename(partial, final);
  }

  /**
   * A domain saved by a snapshot: finish the snapshot's files, then bring the domain back as it was (`thaw`)
   * or leave it off (a stop wanted it off anyway). A snapshot's own last step, and the recovery of one the
   * agent died in. The domain comes back even when the files cannot be finished.
   */
  async function settle(d: DomainRecord, thaw: boolean): Promise<DomainRecord> {
    if (!d.saving) return d;
    const { saving, ...rest } = d;
    const back = { ...rest, state: thaw ? saving.power : "stopped" };
    try {
      if (!existsSync(paths.snapshot(d.id, saving.snapshotId))) await capture({ ...rest, state: saving.power }, saving.snapshotId);
    } finally {
      await save(back);
    }
    return back;
  }

  function power(move: keyof typeof moves) {
    return (id: string) =>
      op(move, id, async () => {
        const saved = await load(id);
        const d = await settle(saved, move !== "stop");
        // Brought back from a save (paused, maybe): started, as the libvirt runtime's start is.
        if (saved.saving && move === "start") return;
        const { to, from } = moves[move];
        if (d.state === to) return;
        if (!from.includes(d.state)) throw new RuntimeError(`Requested operation is not valid: domain '${id}' is ${d.state}, cannot ${move}`, false);
        await save({ ...d, state: to });
      });
  }

  return {
    id: "fake",
    serves: opts.serves ?? ["fake", "libvirt-kvm"],

    async capacity() {
      return structuredClone(cap);
    },

    async list() {
      const names = (await readdir(join(dir, "domains"))).filter((n) => n.endsWith(".json")).sort();
      const out: DomainStatus[] = [];
      for (const name of names) {
        let d: DomainRecord;
        try {
          d = JSON.parse(await readFile(join(dir, "domains", name), "utf8"));
        } catch (err) {
          if (isMissing(err)) continue; // removed since readdir
          throw err;
        }
        out.push({ id: d.id, state: d.state, shape: { ...d.shape }, addresses: [...(d.addresses ?? [])] });
      }
      return out;
    },

    create: (spec) =>
      op("create", spec.id, async () => {
        if (existsSync(paths.domain(spec.id))) return;
        const { url, sha256 } = spec.image;
        if (!sha256Hex.test(sha256)) throw new RuntimeError(`image ${url}: '${sha256}' is not a sha256 digest`, false);
        // The "download": one base per digest, shared by every overlay on it and never fetched twice.
        if (!existsSync(paths.image(sha256))) {
          await writeAtomic(paths.image(sha256), `${JSON.stringify({ url, sha256, format: spec.image.format, fetchedAt: new Date().toISOString() })}\n`);
        }
        await writeAtomic(paths.overlay(spec.id), overlay(sha256, spec.diskGib));
        await writeAtomic(paths.seed(spec.id), `${JSON.stringify({ volumeId: "cidata", files: renderSeed(spec) }, null, 2)}\n`);
        // The domain file goes last: it is what makes the domain exist, so a crash before it leaves a create
        // that simply runs again.
        await save({
          id: spec.id,
          state: "stopped",
          shape: { vcpus: spec.vcpus, memoryMib: spec.memoryMib, diskGib: spec.diskGib },
          mac: spec.nic.mac,
          image: { url, sha256 },
          createdAt: new Date().toISOString(),
        });
      }),

    start: power("start"),
    stop: power("stop"),
    pause: power("pause"),
    resume: power("resume"),

    resize: (id, shape) =>
      op("resize", id, async () => {
        const d = await settle(await load(id), false);
        if (d.state !== "stopped") throw new RuntimeError(`Requested operation is not valid: domain '${id}' is ${d.state}, resize needs it stopped`, false);
        for (const k of ["vcpus", "memoryMib", "diskGib"] as const) {
          if (!Number.isInteger(shape[k]) || shape[k] <= 0) throw new RuntimeError(`invalid ${k}: ${shape[k]}`, false);
        }
        if (shape.diskGib < d.shape.diskGib) throw new RuntimeError(`disk cannot shrink: ${d.shape.diskGib} GiB to ${shape.diskGib} GiB`, false);
        if (shape.diskGib > d.shape.diskGib) await writeAtomic(paths.overlay(id), overlay(d.image.sha256, shape.diskGib));
        await save({ ...d, shape: { vcpus: shape.vcpus, memoryMib: shape.memoryMib, diskGib: shape.diskGib } });
      }),

    remove: (id) =>
      op("remove", id, async () => {
        // Domain file last, for the same reason as in create: until it is gone the domain is listed and a
        // remove interrupted halfway gets called again.
        await rm(paths.overlay(id), { force: true });
        await rm(paths.seed(id), { force: true });
        await rm(paths.snapshots(id), { recursive: true, force: true });
        await rm(paths.domain(id), { force: true });
      }),

    // The fake's memory is its domain record: a snapshot keeps the record and a copy of the overlay.
    snapshot: (id, snapshotId) =>
      op("snapshot", id, async () => {
        const final = paths.snapshot(id, snapshotId);
        const d = await settle(await load(id), true);
        if (existsSync(final)) return { sizeBytes: await bytesIn(final) };
        if (d.state !== "running" && d.state !== "paused")
          throw new RuntimeError(`Requested operation is not valid: domain '${id}' is not running: no memory to save`, false);
        // Off while saved, as under libvirt: a status read meanwhile sees it stopped.
        const saving: DomainRecord = { ...d, state: "stopped", saving: { snapshotId, power: d.state } };
        await save(saving);
        await delay("snapshot");
        await settle(saving, true);
        return { sizeBytes: await bytesIn(final) };
      }),

    restore: (id, snapshotId) =>
      op("restore", id, async () => {
        const final = paths.snapshot(id, snapshotId);
        const { saving: _, ...d } = await load(id);
        if (!existsSync(final)) throw new RuntimeError(`no snapshot ${snapshotId} of domain '${id}'`, false);
        const saved = JSON.parse(await readFile(join(final, "domain.json"), "utf8")) as DomainRecord;
        const tmp = tmpName(paths.overlay(id));
        await copyFile(join(final, "overlay.qcow2"), tmp);
        await rename(tmp, paths.overlay(id));
        await save({ ...d, state: saved.state, shape: saved.shape });
      }),

    async close() {
      // Nothing is held open; waiting for operations in flight lets a caller delete the directory afterwards.
      await Promise.allSettled([...chains.values()]);
    },
  };
}
