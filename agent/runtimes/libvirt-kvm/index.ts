import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { Capacity, ExecRequest, ExecResult, InstanceSpec } from "../../../contracts/host.ts";
import { PASS_THROUGH_DIR, sweepTemporaries } from "../files.ts";
import { type DomainStatus, type Runtime, RuntimeError } from "../runtime.ts";
import { type Dom, daemonSocket, type Hypervisor, openLibvirt } from "./binding.ts";
import { createFromSnapshot } from "./clone-create.ts";
import type { DomainContext } from "./context.ts";
import { makeOverlay, writeSeedIso } from "./disks.ts";
import { type DirectBoot, type DomainType, domainXml, ownedBy } from "./domain-xml.ts";
import { envOf, keepEnv } from "./env-file.ts";
import { run } from "./exec.ts";
import { asRuntimeError, guestExec } from "./guest-exec.ts";
import { detectDomainType, diskGib } from "./host.ts";
import { ImageCache, type ImageSources, imageInfo } from "./images.ts";
import { LibvirtRpc } from "./rpc.ts";
import { revert, settle, takeSnapshot } from "./snapshot-ops.ts";
import { snapshotPaths } from "./snapshots.ts";
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
  /** How long exec waits for a guest's agent that is not connected yet (a guest still booting). Default 15 s. */
  agentWaitMs?: number;
}

export { type Hypervisor, openLibvirt } from "./binding.ts";
export { makeOverlay, writeSeedIso } from "./disks.ts";

const isInstance = (name: string) => /^inst_[a-z2-7]+$/.test(name);

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
  /** Handles of this runtime's domains, kept from their last lookup (a handle names its domain by UUID). */
  private readonly handles = new Map<string, Dom>();
  private readonly crashes = new CrashWatch();
  /** What ./snapshot-ops.ts and ./clone-create.ts work through. */
  private readonly context: DomainContext;
  /** Guest agent commands go to libvirtd over its RPC protocol (./rpc.ts), opened at the first exec. */
  private agentRpc: LibvirtRpc | null = null;

  constructor(
    private readonly hv: Hypervisor,
    private readonly o: LibvirtOptions & { stateDir: string },
    readonly domainType: DomainType,
    private readonly owner: string,
  ) {
    this.images = new ImageCache(join(o.stateDir, "images"), o.imageSources);
    this.context = {
      hv,
      owner,
      stateDir: o.stateDir,
      instanceDir: (id) => this.dir(id),
      overlayPath: (id) => this.overlayPath(id),
      lookup: (id) => this.lookup(id),
      must: (id) => this.must(id),
      power: (d) => this.power(d),
      libvirt: (call) => this.libvirt(call),
      forgetDisk: (id) => this.disks.delete(id),
    };
  }

  private dir(id: string): string {
    if (!isInstance(id)) throw new RuntimeError(`not an instance id: ${id}`, false, "invalid");
    return join(this.o.stateDir, "instances", id);
  }
  consolePath = (id: string) => join(this.dir(id), "console.log");
  overlayPath = (id: string) => join(this.dir(id), "overlay.qcow2");
  snapshotDir = (id: string, snapshotId: string) => snapshotPaths(this.dir(id), snapshotId).final;

  async capacity(): Promise<Capacity> {
    const node = await this.libvirt(() => this.hv.nodeGetInfo());
    return { vcpus: node.cpus, memoryMib: Math.floor(node.memory / 1024), diskGib: diskGib(this.o.stateDir), gpus: this.o.gpus ?? [] };
  }

  /** Every domain of ours, each looked at beside the others: a report waits on this, and a create's RUNNING on the report. */
  async list(): Promise<DomainStatus[]> {
    const seen = await Promise.all(
      (await this.libvirt(() => this.hv.connectListAllDomains())).map(async (d): Promise<DomainStatus | null> => {
        let name: string;
        let info: Awaited<ReturnType<Hypervisor["domainGetInfo"]>>;
        try {
          name = await this.libvirt(() => this.hv.domainGetName(d));
          if (!isInstance(name) || !(await this.mine(name, d))) return null;
          info = await this.libvirt(() => this.hv.domainGetInfo(d));
        } catch (e) {
          // Undefined since it was listed (by anyone sharing this libvirtd): it is not there to report.
          if (/Domain not found/i.test((e as Error).message)) return null;
          throw e;
        }
        return {
          id: name,
          state: await this.crashes.seen(name, info.state, this.o.uri ?? "qemu:///system"),
          shape: { vcpus: info.nrVirtCpu, memoryMib: Math.floor(info.maxMem / 1024), diskGib: await this.diskOf(name) },
          addresses: [],
        };
      }),
    );
    return seen.filter((d) => d !== null);
  }

  async create(spec: InstanceSpec): Promise<void> {
    const dir = this.dir(spec.id);
    if (spec.fromSnapshot) {
      await keepEnv(dir, spec.env);
      await createFromSnapshot(this.context, spec, spec.fromSnapshot);
      this.owned.set(spec.id, true);
      return;
    }
    if (await this.lookup(spec.id)) return keepEnv(dir, spec.env);
    if (spec.image.format === "iso") throw new RuntimeError("installing from an ISO image is not supported by libvirt-kvm yet", false, "unsupported");
    // No base larger than the instance's own disk: a tenant's URL must not fill the host.
    const base = await this.images.get(spec.image, spec.diskGib * 2 ** 30);
    await mkdir(dir, { recursive: true });
    await chmod(dir, PASS_THROUGH_DIR);
    const paths = { overlay: this.overlayPath(spec.id), seed: join(dir, "seed.iso"), console: this.consolePath(spec.id) };
    // Three files that need nothing of each other, each a process or a write: made side by side. The domain is
    // defined only once all three are there (a defined domain is what a retry takes for a finished create).
    await Promise.all([
      existsSync(paths.overlay) ? null : makeOverlay(base, spec.image.format, paths.overlay, spec.diskGib),
      writeSeedIso(spec, paths.seed),
      keepEnv(dir, spec.env),
    ]);
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
    if (await this.quickly(id, (d) => this.hv.domainSuspend(d))) return;
    const d = await this.must(id);
    await this.settle(id, d, true);
    if ((await this.power(d)) === "running") await this.libvirt(() => this.hv.domainSuspend(d));
  }

  async resume(id: string): Promise<void> {
    if (await this.quickly(id, (d) => this.hv.domainResume(d))) return;
    const d = await this.must(id);
    await this.settle(id, d, true);
    if ((await this.power(d)) === "paused") await this.libvirt(() => this.hv.domainResume(d));
  }

  /**
   * A pause or resume (a warm claim waits on one) tried first on its own, on the domain's handle from its last
   * lookup: libvirt refuses it unless the guest is in the state it leaves (or the handle names a domain that is
   * gone), and only then is the domain looked up afresh and the saved memory of an interrupted snapshot and
   * the power state looked at. The common path is the one call a bare client would make.
   */
  private async quickly(id: string, call: (d: Dom) => Promise<unknown>): Promise<boolean> {
    try {
      await call(this.handles.get(id) ?? (await this.must(id)));
      return true;
    } catch {
      return false;
    }
  }

  async resize(id: string, shape: DomainStatus["shape"]): Promise<void> {
    const d = await this.must(id);
    await this.settle(id, d, false);
    if ((await this.power(d)) !== "stopped") throw new RuntimeError(`resize needs ${id} stopped`, false, "not-running");
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
    this.handles.delete(id);
    this.crashes.clear(id);
  }

  snapshot(id: string, snapshotId: string): Promise<{ sizeBytes: number }> {
    return takeSnapshot(this.context, id, snapshotId);
  }

  restore(id: string, snapshotId: string): Promise<void> {
    return revert(this.context, id, snapshotId);
  }

  private settle(id: string, d: Dom, thaw: boolean): Promise<void> {
    return settle(this.context, id, d, thaw);
  }

  /**
   * Through the QEMU guest agent (./guest-exec.ts), with the env the instance was created with under the
   * request's. Only a running guest: a paused one cannot answer, and a stopped one has nothing to run it in.
   */
  async exec(id: string, req: Omit<ExecRequest, "instanceId">, onOutput: (stream: "stdout" | "stderr", data: string) => void): Promise<ExecResult> {
    // No settle here, unlike the power methods: an exec may run beside a snapshot of the same domain. The domain
    // is looked up once (whose it is never changes); whether it runs, libvirt's refusal says (`notRunning`).
    if (this.owned.get(id) !== true) await this.must(id);
    const socket = daemonSocket(this.o.uri);
    if (!socket) throw new RuntimeError(`exec needs libvirtd on this machine (qemu:///system), not ${this.o.uri}`, false);
    this.agentRpc ??= new LibvirtRpc(socket);
    const rpc = this.agentRpc;
    const env = await envOf(this.dir(id));
    const agent = async (command: object) => {
      const reply = JSON.parse(await rpc.agentCommand(id, JSON.stringify(command), 10)) as { return?: unknown; error?: { desc?: string } };
      if (reply.error) throw new RuntimeError(`guest agent: ${reply.error.desc ?? JSON.stringify(reply.error)}`, false, "unsupported");
      return reply.return;
    };
    try {
      const notRunning = async () => {
        const power = await this.power(await this.must(id));
        return power === "running" ? null : new RuntimeError(`${id} is ${power}: exec needs it running`, false, "not-running");
      };
      return await guestExec(id, agent, req, { env, agentWaitMs: this.o.agentWaitMs ?? 15_000, notRunning }, onOutput);
    } catch (e) {
      throw asRuntimeError(e);
    }
  }

  async close(): Promise<void> {
    this.agentRpc?.close();
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
    if (!(await this.mine(id, d))) return null;
    this.handles.set(id, d);
    return d;
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
    if (!d) throw new RuntimeError(`no domain ${id} on this host`, true, "not-found");
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
