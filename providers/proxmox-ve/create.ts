import type { CreateMachine, Machine, ProviderOffer } from "../../core/pools/provider/contract.ts";
import { type Params, PveError, vmidTaken } from "./http.ts";
import { decodeSshKeys, encodeSshKeys, instanceTag, joinTags, managedTag, markerText, splitTags } from "./labels.ts";
import { destroy, powerOn } from "./power.ts";
import { agentOn, type Config, type Current, type Ref, type Row, type Vms } from "./vms.ts";

/**
 * create: adopt the instance's VM if one exists, else clone the image's template to a fresh VMID; then make
 * its config match the offer (cores, memory, tags, cloud-init user, keys, DHCP, agent), grow its disk, and
 * start it. Each step looks before it acts, so a create that died half-way is finished by the next one.
 *
 * User data is not passed: PVE takes custom cloud-init only as a `cicustom` snippet file on a storage, which
 * its API cannot upload. Keys go to `root` (ciuser), which PVE's cloud-init then allows to log in.
 */

const cloneTries = 10;
const hostname = /^(?=.{1,63}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$/;

const invalid = (message: string) => new PveError("invalid", `proxmox-ve: ${message}`, message, { code: "invalid" });

export async function createMachine(vms: Vms, offers: ProviderOffer[], managedBy: string, req: CreateMachine): Promise<Machine> {
  const offer = offers.find((o) => o.name === req.offer);
  if (!offer) throw invalid(`no offer named ${req.offer} (this account has ${offers.map((o) => o.name).join(", ")})`);
  const template = vms.config.templates[req.image];
  if (template === undefined) throw invalid(`no template for image ${req.image} (this account has ${Object.keys(vms.config.templates).join(", ")})`);
  if (!hostname.test(req.name)) throw invalid(`${req.name} is not a hostname PVE accepts as a VM name`);

  const rows = await vms.rows();
  let ref = await adopt(vms, req, rows);
  if (!ref) {
    const mine = await cloneTemplate(vms, req, template, managedBy, rows);
    ref = await settle(vms, req, mine);
  }
  const cur = await untilUnlocked(vms, ref);
  await configure(vms, ref, req, offer);
  if (req.start && cur.status !== "running") await powerOn(vms, ref);
  const made = await vms.look(ref.vmid);
  if (!made) throw new PveError("transient", `proxmox-ve: VM ${ref.vmid} vanished while it was being created`, "vanished");
  return made;
}

/** The instance's VMs, oldest (lowest VMID) first, among those named like it or tagged for it; one being destroyed is no longer its. */
async function instanceVms(vms: Vms, req: CreateMachine, all?: Row[]): Promise<{ ours: Row[]; others: Row[] }> {
  const tag = instanceTag(req.instanceId);
  const rows = (all ?? (await vms.rows())).filter((r) => !r.template && r.lock !== "destroyed" && (r.name === req.name || splitTags(r.tags).includes(tag)));
  const labelled = await vms.labelled(rows);
  return {
    ours: labelled.filter((l) => l.marker.instanceId === req.instanceId).map((l) => l.row),
    others: labelled.filter((l) => l.marker.instanceId !== req.instanceId && l.row.name === req.name).map((l) => l.row),
  };
}

async function adopt(vms: Vms, req: CreateMachine, rows: Row[]): Promise<Ref | null> {
  const { ours, others } = await instanceVms(vms, req, rows);
  if (ours[0]) return { vmid: ours[0].vmid, node: ours[0].node };
  if (others[0]) throw invalid(`a VM named ${req.name} (VMID ${others[0].vmid}) exists and is not this instance's`);
  return null;
}

/** Clones the template to a new VMID; when a concurrent create took that VMID first, takes another. */
async function cloneTemplate(vms: Vms, req: CreateMachine, template: number, managedBy: string, rows: Row[]): Promise<Ref> {
  const { api, config } = vms;
  const source = rows.find((r) => r.vmid === template);
  if (!source) throw invalid(`template VM ${template} (image ${req.image}) is not in the cluster`);
  const tried = new Set<number>();
  for (let attempt = 0; attempt < cloneTries; attempt++) {
    const newid = await nextVmid(vms, rows, tried);
    tried.add(newid);
    try {
      const upid = await api.post<string>(`/nodes/${encodeURIComponent(source.node)}/qemu/${template}/clone`, {
        newid,
        name: req.name,
        description: markerText(req.instanceId, managedBy),
        full: 1,
        storage: config.storage,
        target: source.node === config.node ? undefined : config.node,
      });
      await api.waitTask(upid);
      return { vmid: newid, node: config.node };
    } catch (e) {
      if (!vmidTaken(e)) throw e;
    }
  }
  throw new PveError("transient", `proxmox-ve: every VMID tried for ${req.name} was taken by concurrent creates (${[...tried].join(", ")})`, "vmid race");
}

/** PVE's next free VMID (it reserves none), or the lowest free one in the account's range. */
async function nextVmid(vms: Vms, rows: Row[], tried: Set<number>): Promise<number> {
  const range = vms.config.vmidRange;
  if (!range) {
    const id = Number(await vms.api.get<string>("/cluster/nextid"));
    // nextid lags behind a clone whose config is not written yet: look past what this create already tried.
    if (!tried.has(id)) return id;
    return probe(vms, new Set(tried), Math.max(...tried) + 1, 999_999_999);
  }
  return probe(vms, new Set([...rows.map((r) => r.vmid), ...tried]), range.lower, range.upper);
}

async function probe(vms: Vms, used: Set<number>, lower: number, upper: number): Promise<number> {
  let probes = 0;
  for (let id = lower; id <= upper && probes < cloneTries; id++) {
    if (used.has(id)) continue;
    probes++;
    try {
      await vms.api.get("/cluster/nextid", { vmid: id });
      return id;
    } catch (e) {
      if (!vmidTaken(e)) throw e;
    }
  }
  throw new PveError("capacity", `proxmox-ve: no free VMID in ${lower}..${upper}`, "no free vmid", { code: "vmid" });
}

/** Two creates of one instance that raced both cloned: the older VM stays, the newer (ours, if newer) goes. */
async function settle(vms: Vms, req: CreateMachine, mine: Ref): Promise<Ref> {
  const oldest = (await instanceVms(vms, req)).ours[0];
  if (!oldest || oldest.vmid >= mine.vmid) return mine;
  await destroy(vms, mine, false, true);
  return { vmid: oldest.vmid, node: oldest.node };
}

/** Waits out a clone still under way (an adopted VM, or the twin a concurrent create is building). */
async function untilUnlocked(vms: Vms, ref: Ref): Promise<Current> {
  const deadline = Date.now() + vms.api.taskTimeoutMs;
  let delay = vms.api.pollMs;
  for (;;) {
    const now = await vms.current(ref.vmid);
    if (!now) throw new PveError("transient", `proxmox-ve: VM ${ref.vmid} vanished while it was being created`, "vanished");
    if (now.cur.lock !== "clone" && now.cur.lock !== "create") return now.cur;
    if (Date.now() > deadline) throw new PveError("transient", `proxmox-ve: VM ${ref.vmid} is still locked (${now.cur.lock})`, "locked");
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 1.5, 2000);
  }
}

async function configure(vms: Vms, ref: Ref, req: CreateMachine, offer: ProviderOffer): Promise<void> {
  const { api, config } = vms;
  const cfg = await vms.readConfig(ref);
  const want: Params = {};
  if (Number(cfg.cores ?? 1) !== offer.vcpus) want.cores = offer.vcpus;
  if (memoryMib(cfg.memory) !== offer.memoryMib) want.memory = offer.memoryMib;
  const tags = joinTags([...splitTags(cfg.tags), managedTag, instanceTag(req.instanceId)]);
  if (tags !== joinTags(splitTags(cfg.tags))) want.tags = tags;
  if (cfg.ciuser !== "root") want.ciuser = "root";
  const keys = req.sshKeys.map((k) => k.trim()).filter(Boolean);
  if (keys.length && decodeSshKeys(cfg.sshkeys).join("\n") !== decodeSshKeys(encodeSshKeys(keys)).join("\n")) want.sshkeys = encodeSshKeys(keys);
  if (cfg.ipconfig0 !== "ip=dhcp") want.ipconfig0 = "ip=dhcp";
  if (!agentOn(cfg.agent)) want.agent = 1;
  const net0 = config.bridge ? withBridge(cfg.net0, config.bridge) : undefined;
  if (net0 && net0 !== cfg.net0) want.net0 = net0;
  if (Object.keys(want).length) await api.put(vms.qemu(ref, "/config"), want);
  vms.forget(ref.vmid); // what get() knew of its agent and addresses is stale now

  const disk = bootDisk(cfg);
  if (disk && disk.gib < offer.diskGib) {
    // PVE 8.0.2 and later answer with a task; older ones resize before answering.
    const upid = await api.put<string | null>(vms.qemu(ref, "/resize"), { disk: disk.key, size: `${offer.diskGib}G` });
    if (typeof upid === "string" && upid.startsWith("UPID:")) await api.waitTask(upid);
  }
}

function memoryMib(v: unknown): number {
  const m = /(?:current=)?(\d+)/.exec(String(v ?? ""));
  return m ? Number(m[1]) : 512;
}

function withBridge(net0: unknown, bridge: string): string {
  const current = typeof net0 === "string" ? net0 : "";
  if (!current) return `virtio,bridge=${bridge}`;
  return /(^|,)bridge=[^,]*/.test(current) ? current.replace(/(^|,)bridge=[^,]*/, `$1bridge=${bridge}`) : `${current},bridge=${bridge}`;
}

const unitGib: Record<string, number> = { K: 1 / 1024 ** 2, M: 1 / 1024, G: 1, T: 1024 };

/** The disk the VM boots from (the first disk in `boot: order=`, else the first of scsi0/virtio0/sata0/ide0) and its size. */
function bootDisk(cfg: Config): { key: string; gib: number } | null {
  const order = /order=([^,]+)/.exec(String(cfg.boot ?? ""))?.[1]?.split(";") ?? [];
  for (const key of [...order, "scsi0", "virtio0", "sata0", "ide0"]) {
    const value = cfg[key];
    if (typeof value !== "string" || /media=cdrom/.test(value)) continue;
    const size = /(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)/.exec(value);
    if (!size) continue;
    return { key, gib: Number(size[1]) * (size[2] ? (unitGib[size[2]] ?? 1) : 1 / 1024 ** 3) };
  }
  return null;
}
