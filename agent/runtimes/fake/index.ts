import { existsSync, mkdirSync } from "node:fs";
import { copyFile, cp, mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { Capacity, InstanceSpec } from "../../../contracts/host.ts";
import { DEFAULT_RUNTIME } from "../../../contracts/runtimes.ts";
import { bytesIn, PRIVATE_DIR, sweepTemporaries } from "../files.ts";
import { type DomainStatus, type Runtime, RuntimeError } from "../runtime.ts";
import { renderSeed } from "../seed.ts";
import { GUEST_PATH, GuestProcesses } from "./exec.ts";
import { consumeInjected, type DomainRecord, type FakeOp, isMissing, type PowerState, safeId, tmpName, writeAtomic } from "./store.ts";

export { clearFailures, crashDomain, type FakeOp, fakeOps, type InjectedFailure, injectFailure, setDomainAddresses } from "./store.ts";

/**
 * The `fake` runtime: a hypervisor made of files, for `bc agent --runtime fake`, `bc dev --sim N` and tests.
 * Everything lives under one directory, so a restarted agent on the same directory finds its domains again,
 * and several fakes can share one process as long as each has its own directory. Its guests' execs are real
 * child processes confined by bubblewrap (./exec.ts), run in a scratch directory per domain that its snapshots
 * keep as its disk.
 */

export interface FakeOptions {
  /** State directory, created if missing. */
  dir: string;
  /** Default: 16 vCPU, 65536 MiB, 1000 GiB, no GPUs. */
  capacity?: Capacity;
  /** Milliseconds each operation waits before it takes effect (default 0), so callers can see it in flight. */
  delays?: Partial<Record<FakeOp, number>>;
  /**
   * The pool runtimes it stands in for. Default: `fake` and the default runtime (`libvirt-kvm`), so simulated
   * hosts join pools made with it (tests, `bc dev --sim`) as the hosts they simulate would.
   */
  serves?: string[];
  /** The bubblewrap binary that confines guests' execs (./confine.ts). Default: the system's `bwrap`. */
  bwrap?: string;
}

const defaultCapacity: Capacity = { vcpus: 16, memoryMib: 65536, diskGib: 1000, gpus: [] };

// Power moves as libvirt allows them: the target state itself is a no-op, the listed sources move, the rest
// is an invalid request (libvirt will not suspend an inactive domain, nor start a paused one).
const moves: Record<"start" | "stop" | "pause" | "resume", { to: PowerState; from: PowerState[] }> = {
  start: { to: "running", from: ["stopped", "crashed"] },
  stop: { to: "stopped", from: ["running", "paused", "crashed"] },
  pause: { to: "paused", from: ["running"] },
  resume: { to: "running", from: ["paused"] },
};

// Digests become file names, as ids do (safeId).
const sha256Hex = /^[0-9a-f]{64}$/;

export function createFakeRuntime(opts: FakeOptions): Runtime {
  const { dir } = opts;
  const cap = opts.capacity ?? defaultCapacity;
  const paths = {
    domain: (id: string) => join(dir, "domains", `${id}.json`),
    overlay: (id: string) => join(dir, "overlays", `${id}.qcow2`),
    seed: (id: string) => join(dir, "seeds", `${id}.iso`),
    image: (sha256: string) => join(dir, "images", sha256),
    snapshots: (id: string) => join(dir, "snapshots", id),
    /**
     * Where the domain's execs run: the fake guest's filesystem, kept with its snapshots as its disk is. Like
     * everything under `dir`, names a restart takes for leftovers (`*.tmp`, `*.part`) are swept from it.
     */
    scratch: (id: string) => join(dir, "scratch", id),
    snapshot: (id: string, snapshotId: string) => {
      if (!safeId.test(snapshotId)) throw new RuntimeError(`invalid snapshot name '${snapshotId}'`, false, "invalid");
      return join(dir, "snapshots", id, snapshotId);
    },
  };
  for (const sub of ["domains", "overlays", "seeds", "images", "snapshots", "scratch"]) mkdirSync(join(dir, sub), { recursive: true, mode: PRIVATE_DIR });
  sweepTemporaries(dir);

  // One promise chain per domain: an operation starts only once the previous one on that domain settled.
  const chains = new Map<string, Promise<unknown>>();
  const guests = new GuestProcesses(opts.bwrap);

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
    if (!safeId.test(id)) throw new RuntimeError(`invalid domain name '${id}'`, false, "invalid");
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
      if (isMissing(err)) throw new RuntimeError(`Domain not found: no domain with matching name '${id}'`, false, "not-found");
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
    if (existsSync(paths.scratch(record.id))) await cp(paths.scratch(record.id), join(partial, "scratch"), { recursive: true });
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

  /** Put a snapshot's disk (overlay, scratch) in place as domain `id`'s, each swapped in whole. */
  async function installSaved(snapshotDir: string, id: string): Promise<void> {
    const tmp = tmpName(paths.overlay(id));
    await copyFile(join(snapshotDir, "overlay.qcow2"), tmp);
    await rename(tmp, paths.overlay(id));
    const scratch = paths.scratch(id);
    const aside = tmpName(scratch);
    if (existsSync(join(snapshotDir, "scratch"))) await cp(join(snapshotDir, "scratch"), aside, { recursive: true });
    else await mkdir(aside, { mode: PRIVATE_DIR });
    await rm(scratch, { recursive: true, force: true });
    await rename(aside, scratch);
  }

  /**
   * A domain that starts life as another's snapshot: its disk and memory (the saved record), this spec's
   * identity, paused at the saved point. A snapshot directory is only ever renamed into place whole and removed
   * with its domain, so it is read without the source's queue (taking it here could deadlock two such creates).
   */
  async function createFromSnapshot(spec: InstanceSpec, from: { instanceId: string; snapshotId: string }): Promise<void> {
    const { instanceId: source, snapshotId } = from;
    if (!safeId.test(source) || source === spec.id) throw new RuntimeError(`cannot make '${spec.id}' from domain '${source}'`, false, "invalid");
    const final = paths.snapshot(source, snapshotId);
    const unknown = () =>
      existsSync(paths.domain(source))
        ? new RuntimeError(`no snapshot ${snapshotId} of domain '${source}'`, false, "not-found")
        : new RuntimeError(`Domain not found: no domain with matching name '${source}'`, false, "not-found");
    let saved: DomainRecord;
    try {
      saved = JSON.parse(await readFile(join(final, "domain.json"), "utf8"));
      await installSaved(final, spec.id);
    } catch (err) {
      // Removed with its domain while being read counts as never there.
      if (isMissing(err)) throw unknown();
      throw err;
    }
    await writeAtomic(paths.seed(spec.id), `${JSON.stringify({ volumeId: "cidata", files: renderSeed(spec) }, null, 2)}\n`);
    // The domain file last, as in create: until it exists the create runs again from the start.
    await save({
      id: spec.id,
      state: "paused",
      shape: saved.shape,
      mac: spec.nic.mac,
      image: saved.image,
      createdAt: new Date().toISOString(),
      env: spec.env,
      network: spec.network,
      fromSnapshot: { instanceId: source, snapshotId },
    });
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
        if (!from.includes(d.state))
          throw new RuntimeError(`Requested operation is not valid: domain '${id}' is ${d.state}, cannot ${move}`, false, "not-running");
        await save({ ...d, state: to });
        // Its execs go with the guest: frozen while it is paused, gone when it is off.
        const signal = { stop: "SIGKILL", pause: "SIGSTOP", resume: "SIGCONT", start: null } as const;
        if (signal[move]) guests.signal(id, signal[move]);
      });
  }

  return {
    id: "fake",
    serves: opts.serves ?? ["fake", DEFAULT_RUNTIME],

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
        if (spec.fromSnapshot) return createFromSnapshot(spec, spec.fromSnapshot);
        const { url, sha256 } = spec.image;
        if (!sha256Hex.test(sha256)) throw new RuntimeError(`image ${url}: '${sha256}' is not a sha256 digest`, false, "invalid");
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
          env: spec.env,
          network: spec.network,
        });
      }),

    start: power("start"),
    stop: power("stop"),
    pause: power("pause"),
    resume: power("resume"),

    resize: (id, shape) =>
      op("resize", id, async () => {
        const d = await settle(await load(id), false);
        if (d.state !== "stopped")
          throw new RuntimeError(`Requested operation is not valid: domain '${id}' is ${d.state}, resize needs it stopped`, false, "not-running");
        for (const k of ["vcpus", "memoryMib", "diskGib"] as const) {
          if (!Number.isInteger(shape[k]) || shape[k] <= 0) throw new RuntimeError(`invalid ${k}: ${shape[k]}`, false, "invalid");
        }
        if (shape.diskGib < d.shape.diskGib) throw new RuntimeError(`disk cannot shrink: ${d.shape.diskGib} GiB to ${shape.diskGib} GiB`, false, "invalid");
        if (shape.diskGib > d.shape.diskGib) await writeAtomic(paths.overlay(id), overlay(d.image.sha256, shape.diskGib));
        await save({ ...d, shape: { vcpus: shape.vcpus, memoryMib: shape.memoryMib, diskGib: shape.diskGib } });
      }),

    remove: (id) =>
      op("remove", id, async () => {
        guests.signal(id, "SIGKILL");
        await rm(paths.scratch(id), { recursive: true, force: true });
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
          throw new RuntimeError(`Requested operation is not valid: domain '${id}' is not running: no memory to save`, false, "not-running");
        // Off while saved, as under libvirt: a status read meanwhile sees it stopped.
        const saving: DomainRecord = { ...d, state: "stopped", saving: { snapshotId, power: d.state } };
        // Its execs hold still while it is saved, so the saved files are of one moment.
        guests.signal(id, "SIGSTOP");
        try {
          await save(saving);
          await delay("snapshot");
          await settle(saving, true);
        } finally {
          if (d.state === "running") guests.signal(id, "SIGCONT");
        }
        return { sizeBytes: await bytesIn(final) };
      }),

    restore: (id, snapshotId) =>
      op("restore", id, async () => {
        const final = paths.snapshot(id, snapshotId);
        const { saving: _, ...d } = await load(id);
        if (!existsSync(final)) throw new RuntimeError(`no snapshot ${snapshotId} of domain '${id}'`, false, "not-found");
        const saved = JSON.parse(await readFile(join(final, "domain.json"), "utf8")) as DomainRecord;
        // Its memory is replaced: whatever its execs were doing is gone.
        guests.signal(id, "SIGKILL");
        await installSaved(final, id);
        await save({ ...d, state: saved.state, shape: saved.shape });
      }),

    exec: async (id, req, onOutput) => {
      if (!safeId.test(id)) throw new RuntimeError(`invalid domain name '${id}'`, false, "invalid");
      // Outside the domain's queue: a slow guest agent holds up no power operation.
      await delay("exec");
      // Checked and started inside it, so a stop queued behind it finds the process to kill; the command then
      // runs outside it, beside other execs and power operations.
      const started = await serial(id, async () => {
        consumeInjected(dir, "exec");
        const d = await load(id);
        if (d.state !== "running")
          throw new RuntimeError(`Requested operation is not valid: domain '${id}' is ${d.state}, exec needs it running`, false, "not-running");
        await mkdir(paths.scratch(id), { recursive: true, mode: PRIVATE_DIR });
        // Only what the guest would have: none of the agent's own environment leaks into a sandbox's command.
        const env = { PATH: GUEST_PATH, ...d.env, ...req.env };
        return { done: guests.run(id, paths.scratch(id), env, req, onOutput) };
      });
      return started.done;
    },

    async close() {
      // Waiting for operations in flight lets a caller delete the directory afterwards. Execs end here: a
      // fake guest is this process's children, and none may outlive it.
      guests.killAll();
      await Promise.allSettled([...chains.values()]);
    },
  };
}
