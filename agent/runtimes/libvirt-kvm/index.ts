import { randomUUID } from "node:crypto";
import { constants, existsSync } from "node:fs";
import { chmod, copyFile, mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { Capacity, InstanceSpec } from "../../../contracts/host.ts";
import { bytesIn, PASS_THROUGH_DIR, PRIVATE_FILE, sweepTemporaries } from "../files.ts";
import { type DomainStatus, type Runtime, RuntimeError } from "../runtime.ts";
import { renderSeed } from "../seed.ts";
import { type DirectBoot, type DomainType, domainXml, ownedBy } from "./domain-xml.ts";
import { run } from "./exec.ts";
import { detectDomainType, diskGib } from "./host.ts";
import { ImageCache, type ImageSources, imageInfo, refuseReferences } from "./images.ts";
import { clearSaving, markSaving, readSaving, type Saving, savedPower, seal, snapshotPaths } from "./snapshots.ts";
import { CrashWatch, powerOf } from "./states.ts";

/**
 * The `libvirt-kvm` runtime: real virtual machines through libvirt and QEMU, over the Node bindings
 * (@unraid/libvirt, an optional dependency built against libvirt's headers). Per instance, under the state
 * directory: a qcow2 overlay on the verified base image, a NoCloud seed ISO and the serial console's log.
 * Domains are named by their instance id; only `inst_…` domains are ever listed or touched.
 */

export interface LibvirtOptions {
  stateDir: string;
  /** Default qemu:///system. */
  uri?: string;
  /** `auto` (default): kvm with hardware virtualisation, else qemu (software emulation). */
  domainType?: DomainType | "auto";
  /** For images that are root filesystems rather than bootable disks: the kernel every domain boots. */
  boot?: DirectBoot;
  /** How long a guest gets to shut down on ACPI power-off before it is destroyed. Default 30 s. */
  shutdownTimeoutMs?: number;
  /** The GPUs this host offers for passthrough, by model and PCI address. */
  gpus?: Capacity["gpus"];
  /** Where base images may be fetched from beyond public https (the operator's allowances), and the fetch's bounds. */
  imageSources?: ImageSources;
}

// What the binding exposes, as far as this runtime uses it.
interface Binding {
  Hypervisor: new (o: { uri: string }) => Hypervisor;
}
type Dom = object;
export interface Hypervisor {
  connectOpen(): Promise<void>;
  connectClose(): Promise<void>;
  connectListAllDomains(): Promise<Dom[]>;
  domainLookupByName(name: string): Promise<Dom>;
  domainDefineXML(xml: string): Promise<Dom>;
  domainCreate(d: Dom): Promise<void>;
  domainShutdown(d: Dom): Promise<void>;
  domainDestroy(d: Dom): Promise<void>;
  domainUndefine(d: Dom): Promise<void>;
  domainSuspend(d: Dom): Promise<void>;
  domainResume(d: Dom): Promise<void>;
  domainSave(d: Dom, path: string): Promise<void>;
  domainRestore(path: string): Promise<void>;
  domainGetName(d: Dom): Promise<string>;
  domainGetInfo(d: Dom): Promise<{ state: number; maxMem: number; nrVirtCpu: number }>;
  domainGetXMLDesc(d: Dom, flags?: number): Promise<string>;
  nodeGetInfo(): Promise<{ cpus: number; memory: number }>;
}

const isInstance = (name: string) => /^inst_[a-z2-7]+$/.test(name);

/** A connection to libvirtd through the optional binding; a clear RuntimeError where it was not built. */
export async function openLibvirt(uri = "qemu:///system"): Promise<Hypervisor> {
  let binding: Binding;
  try {
    binding = (await import("@unraid/libvirt" as string)) as Binding;
  } catch (e) {
    throw new RuntimeError(`the libvirt-kvm runtime needs the optional @unraid/libvirt binding (built with libvirt-dev at npm install): ${e}`, true);
  }
  const hv = new binding.Hypervisor({ uri });
  await hv.connectOpen();
  return hv;
}

/** An instance's disk: a qcow2 overlay on its base, made aside and renamed, so a killed agent never reuses half of one. */
export async function makeOverlay(base: string, baseFormat: string, path: string, diskGib: number): Promise<void> {
  const tmp = `${path}.tmp`;
  await run("qemu-img", ["create", "-q", "-f", "qcow2", "-F", baseFormat, "-b", base, tmp, `${diskGib}G`]);
  await rename(tmp, path);
}

/** The instance's NoCloud seed (./seed.ts), burnt to an ISO labelled `cidata`. */
export async function writeSeedIso(spec: InstanceSpec, iso: string): Promise<void> {
  const tmp = await mkdtemp(join(dirname(iso), "seed-"));
  try {
    const files = renderSeed(spec);
    for (const [name, body] of Object.entries(files)) await writeFile(join(tmp, name), body, { mode: PRIVATE_FILE });
    await run("genisoimage", ["-quiet", "-output", iso, "-volid", "cidata", "-joliet", "-rock", ...Object.keys(files).map((f) => join(tmp, f))]);
    // The seed holds the owner's user data: the host's alone (libvirt hands it to QEMU's user at start).
    await chmod(iso, PRIVATE_FILE);
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
}

export async function createLibvirtRuntime(o: LibvirtOptions): Promise<Runtime & LibvirtRuntimeExtras> {
  const hv = await openLibvirt(o.uri);
  const stateDir = resolve(o.stateDir);
  await mkdir(join(stateDir, "instances"), { recursive: true });
  // QEMU runs as its own user and must reach each instance's disk and seed: these directories let it (and
  // anyone) pass through without listing them; the files in them are the owner's (libvirt hands each disk to
  // QEMU's user while its domain runs).
  for (const d of [stateDir, join(stateDir, "instances")]) await chmod(d, PASS_THROUGH_DIR);
  sweepTemporaries(stateDir);
  // Who this runtime is, kept with its state: several agents (or other tools) may share one libvirtd, and a
  // domain another one made is never listed, reported as an orphan or removed here.
  const ownerFile = join(stateDir, "owner");
  if (!existsSync(ownerFile)) await writeFile(ownerFile, `${randomUUID()}\n`, { flag: "wx" }).catch(() => {});
  const owner = (await readFile(ownerFile, "utf8")).trim();
  return new LibvirtRuntime(hv, { ...o, stateDir }, o.domainType && o.domainType !== "auto" ? o.domainType : detectDomainType(), owner);
}

export interface LibvirtRuntimeExtras {
  readonly domainType: DomainType;
  /** Where an instance's serial console is written (tests and operators read the guest's own words there). */
  consolePath(id: string): string;
  overlayPath(id: string): string;
  /** Where snapshot `snapshotId` of an instance keeps its files (./snapshots.ts). */
  snapshotDir(id: string, snapshotId: string): string;
}

class LibvirtRuntime implements Runtime, LibvirtRuntimeExtras {
  readonly id = "libvirt-kvm";
  private readonly images: ImageCache;
  /** Disk sizes by instance: libvirt's domain info has no disk, and qemu-img is a process per call. */
  private readonly disks = new Map<string, number>();
  /** Whether a domain (by name) is this runtime's; a name's owner never changes while it exists. */
  private readonly owned = new Map<string, boolean>();
  private readonly crashes = new CrashWatch();

  constructor(
    private readonly hv: Hypervisor,
    private readonly o: LibvirtOptions & { stateDir: string },
    readonly domainType: DomainType,
    private readonly owner: string,
  ) {
    this.images = new ImageCache(join(o.stateDir, "images"), o.imageSources);
  }

  private dir(id: string): string {
    if (!isInstance(id)) throw new RuntimeError(`not an instance id: ${id}`, false);
    return join(this.o.stateDir, "instances", id);
  }
  consolePath = (id: string) => join(this.dir(id), "console.log");
  overlayPath = (id: string) => join(this.dir(id), "overlay.qcow2");
  snapshotDir = (id: string, snapshotId: string) => snapshotPaths(this.dir(id), snapshotId).final;

  async capacity(): Promise<Capacity> {
    const node = await this.libvirt(() => this.hv.nodeGetInfo());
    return { vcpus: node.cpus, memoryMib: Math.floor(node.memory / 1024), diskGib: diskGib(this.o.stateDir), gpus: this.o.gpus ?? [] };
  }

  async list(): Promise<DomainStatus[]> {
    const out: DomainStatus[] = [];
    for (const d of await this.libvirt(() => this.hv.connectListAllDomains())) {
      const name = await this.libvirt(() => this.hv.domainGetName(d));
      if (!isInstance(name) || !(await this.mine(name, d))) continue;
      const info = await this.libvirt(() => this.hv.domainGetInfo(d));
      out.push({
        id: name,
        state: await this.crashes.seen(name, info.state, this.o.uri ?? "qemu:///system"),
        shape: { vcpus: info.nrVirtCpu, memoryMib: Math.floor(info.maxMem / 1024), diskGib: await this.diskOf(name) },
        addresses: [],
      });
    }
    return out;
  }

  async create(spec: InstanceSpec): Promise<void> {
    const dir = this.dir(spec.id);
    if (await this.lookup(spec.id)) return;
    if (spec.image.format === "iso") throw new RuntimeError("installing from an ISO image is not supported by libvirt-kvm yet", false);
    // No base larger than the instance's own disk: a tenant's URL must not fill the host.
    const base = await this.images.get(spec.image, spec.diskGib * 2 ** 30);
    await mkdir(dir, { recursive: true });
    await chmod(dir, PASS_THROUGH_DIR);
    const paths = { overlay: this.overlayPath(spec.id), seed: join(dir, "seed.iso"), console: this.consolePath(spec.id) };
    if (!existsSync(paths.overlay)) await makeOverlay(base, spec.image.format, paths.overlay, spec.diskGib);
    await writeSeedIso(spec, paths.seed);
    const xml = domainXml(spec, { type: this.domainType, owner: this.owner, paths, boot: this.o.boot });
    await this.libvirt(() => this.hv.domainDefineXML(xml));
    this.owned.set(spec.id, true);
    this.disks.set(spec.id, spec.diskGib);
  }

  async start(id: string): Promise<void> {
    const d = await this.must(id);
    await this.settle(id, d, true);
    this.crashes.clear(id);
    const now = await this.power(d);
    // A guest kept crashed (on_crash=preserve) still has its QEMU: that one goes before the guest boots afresh.
    if (now === "crashed") await this.libvirt(() => this.hv.domainDestroy(d));
    if (now === "stopped" || now === "crashed") await this.libvirt(() => this.hv.domainCreate(d));
  }

  async stop(id: string): Promise<void> {
    const d = await this.must(id);
    await this.settle(id, d, false);
    this.crashes.clear(id);
    const now = await this.power(d);
    if (now === "stopped") return;
    // A paused guest cannot answer the power button; a running one gets a bounded chance to shut down cleanly.
    if (now === "running") {
      await this.libvirt(() => this.hv.domainShutdown(d));
      const end = Date.now() + (this.o.shutdownTimeoutMs ?? 30_000);
      while (Date.now() < end) {
        if ((await this.power(d)) === "stopped") return;
        await sleep(200);
      }
    }
    if ((await this.power(d)) !== "stopped") await this.libvirt(() => this.hv.domainDestroy(d));
  }

  async pause(id: string): Promise<void> {
    const d = await this.must(id);
    await this.settle(id, d, true);
    if ((await this.power(d)) === "running") await this.libvirt(() => this.hv.domainSuspend(d));
  }

  async resume(id: string): Promise<void> {
    const d = await this.must(id);
    await this.settle(id, d, true);
    if ((await this.power(d)) === "paused") await this.libvirt(() => this.hv.domainResume(d));
  }

  async resize(id: string, shape: DomainStatus["shape"]): Promise<void> {
    const d = await this.must(id);
    await this.settle(id, d, false);
    if ((await this.power(d)) !== "stopped") throw new RuntimeError(`resize needs ${id} stopped`, false);
    const xml = (await this.libvirt(() => this.hv.domainGetXMLDesc(d, 2))) // 2: the inactive (persistent) definition
      .replace(/<memory[^>]*>\d+<\/memory>/, `<memory unit='MiB'>${shape.memoryMib}</memory>`)
      .replace(/<currentMemory[^>]*>\d+<\/currentMemory>/, `<currentMemory unit='MiB'>${shape.memoryMib}</currentMemory>`)
      .replace(/<vcpu([^>]*)>\d+<\/vcpu>/, `<vcpu$1>${shape.vcpus}</vcpu>`);
    await this.libvirt(() => this.hv.domainDefineXML(xml));
    if (shape.diskGib > (await this.diskOf(id))) await run("qemu-img", ["resize", "-q", this.overlayPath(id), `${shape.diskGib}G`]);
    this.disks.set(id, Math.max(shape.diskGib, await this.diskOf(id)));
  }

  async remove(id: string): Promise<void> {
    const d = await this.lookup(id);
    if (d) {
      if ((await this.power(d)) !== "stopped") await this.libvirt(() => this.hv.domainDestroy(d));
      await this.libvirt(() => this.hv.domainUndefine(d));
    }
    await rm(this.dir(id), { recursive: true, force: true });
    this.disks.delete(id);
    this.owned.delete(id);
    this.crashes.clear(id);
  }

  /**
   * Save stops the domain and writes its memory; while it is off, the overlay is copied; then the domain is
   * restored from that memory and carries on (`settle`). Files as ./snapshots.ts lays them out.
   */
  async snapshot(id: string, snapshotId: string): Promise<{ sizeBytes: number }> {
    const d = await this.must(id);
    const { final, partial } = snapshotPaths(this.dir(id), snapshotId);
    await this.settle(id, d, true);
    if (existsSync(final)) return { sizeBytes: await bytesIn(final) };
    const power = await this.power(d);
    if (power !== "running" && power !== "paused") throw new RuntimeError(`${id} is not running: no memory to save`, false);
    await rm(partial, { recursive: true, force: true });
    await mkdir(partial, { recursive: true });
    await markSaving(this.dir(id), { snapshotId, power });
    try {
      await this.libvirt(() => this.hv.domainSave(d, join(partial, "memory.save")));
    } catch (e) {
      // Not saved, so still as it was: nothing to finish later.
      await clearSaving(this.dir(id));
      throw e;
    }
    await this.settle(id, d, true);
    return { sizeBytes: await bytesIn(final) };
  }

  /**
   * The snapshot's disk copied aside and checked, the domain destroyed if it runs (it is being reverted), the
   * copy renamed over the overlay, then the saved memory restored: the guest runs on from the saved point, in
   * the power state it was saved in. A refused disk leaves the domain as it was.
   */
  async restore(id: string, snapshotId: string): Promise<void> {
    const d = await this.must(id);
    const { final } = snapshotPaths(this.dir(id), snapshotId);
    if (!existsSync(final)) throw new RuntimeError(`no snapshot ${snapshotId} of ${id} on this host`, false);
    const power = await savedPower(final);
    const overlay = this.overlayPath(id);
    const tmp = `${overlay}.restore.tmp`;
    await copyFile(join(final, "disk.qcow2"), tmp, constants.COPYFILE_FICLONE);
    try {
      await this.refuseForeignDisk(id, tmp);
      if ((await this.power(d)) !== "stopped") await this.libvirt(() => this.hv.domainDestroy(d));
      await this.settle(id, d, false);
      await rename(tmp, overlay);
    } finally {
      await rm(tmp, { force: true });
    }
    this.disks.delete(id);
    await this.thaw(d, join(final, "memory.save"), power);
  }

  /**
   * A domain a snapshot saved (off): its snapshot's files completed and renamed into place, then the domain
   * restored from its memory (`thaw`), or left off when the caller wants it off anyway. A snapshot's own last
   * step, and the recovery of one this process died in. The guest's memory comes back even when the files
   * cannot be completed; a save that left no memory file leaves the domain to boot afresh.
   */
  private async settle(id: string, d: Dom, thaw: boolean): Promise<void> {
    const saving = await readSaving(this.dir(id));
    if (!saving) return;
    const { final, partial } = snapshotPaths(this.dir(id), saving.snapshotId);
    const memory = () => [join(final, "memory.save"), join(partial, "memory.save")].find((f) => existsSync(f));
    try {
      if ((await this.power(d)) !== "stopped" || !memory()) return;
      try {
        if (!existsSync(final)) await seal(this.overlayPath(id), partial, final, saving.power);
      } finally {
        const saved = memory();
        if (thaw && saved) await this.thaw(d, saved, saving.power);
      }
    } finally {
      // Once only: a memory file that cannot be restored must not keep the domain from booting afresh.
      await clearSaving(this.dir(id));
      await rm(partial, { recursive: true, force: true });
    }
  }

  /** Restore saved memory and end in `power`: the save file records it, but nothing in the binding says so. */
  private async thaw(d: Dom, memory: string, power: Saving["power"]): Promise<void> {
    await this.libvirt(() => this.hv.domainRestore(memory));
    const now = await this.power(d);
    if (power === "paused" && now === "running") await this.libvirt(() => this.hv.domainSuspend(d));
    if (power === "running" && now === "paused") await this.libvirt(() => this.hv.domainResume(d));
  }

  /** An instance's disk must stand on a verified base of this host's cache, and name nothing else. */
  private async refuseForeignDisk(id: string, disk: string): Promise<void> {
    const info = await imageInfo(disk, "qcow2");
    const backing = info["full-backing-filename"] ?? info["backing-filename"];
    if (!backing || dirname(resolve(dirname(disk), backing)) !== join(this.o.stateDir, "images")) {
      throw new RuntimeError(`the disk of ${id} stands on ${backing ?? "nothing"}, not on a verified base of this host; refused`, false);
    }
    refuseReferences({ ...info, "backing-filename": undefined, "full-backing-filename": undefined }, `the disk of ${id}`);
  }

  async close(): Promise<void> {
    await this.hv.connectClose().catch(() => {});
  }

  private async diskOf(id: string): Promise<number> {
    const known = this.disks.get(id);
    if (known !== undefined) return known;
    const size = existsSync(this.overlayPath(id)) ? Math.round((await imageInfo(this.overlayPath(id), "qcow2"))["virtual-size"] / 2 ** 30) : 0;
    this.disks.set(id, size);
    return size;
  }

  /** This runtime's domain of that name, or null (absent, or another runtime's). */
  private async lookup(id: string): Promise<Dom | null> {
    this.dir(id);
    let d: Dom;
    try {
      d = await this.hv.domainLookupByName(id);
    } catch {
      return null;
    }
    return (await this.mine(id, d)) ? d : null;
  }

  private async mine(name: string, d: Dom): Promise<boolean> {
    let owned = this.owned.get(name);
    if (owned === undefined) {
      owned = ownedBy(await this.libvirt(() => this.hv.domainGetXMLDesc(d, 2)), this.owner);
      this.owned.set(name, owned);
    }
    return owned;
  }

  private async power(d: Dom): Promise<DomainStatus["state"]> {
    return powerOf((await this.libvirt(() => this.hv.domainGetInfo(d))).state);
  }

  private async must(id: string): Promise<Dom> {
    const d = await this.lookup(id);
    if (!d) throw new RuntimeError(`no domain ${id} on this host`, true);
    return d;
  }

  /** libvirt's own message, as a runtime error a report can carry (the binding loses libvirt's error codes). */
  private async libvirt<T>(call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (e) {
      if (e instanceof RuntimeError) throw e;
      throw new RuntimeError(`libvirt: ${e instanceof Error ? e.message : String(e)}`, true);
    }
  }
}
