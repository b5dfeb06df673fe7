import { createHash } from "node:crypto";
import { PveFail, paramFail, validateConfig } from "./emulator-params.ts";
import { hex8, Tasks } from "./emulator-tasks.ts";
import { instanceTag, joinTags, managedTag, markerText, readMarker } from "./labels.ts";

/**
 * The emulator's cluster: one node's QEMU VMs and tasks, in memory, answering as PVE's handlers do (see
 * emulator.ts for what is modelled). Handlers return the `data` of a success or throw a PveFail.
 */

type Value = string | number;

export interface Vm {
  vmid: number;
  status: "running" | "stopped";
  lock?: string;
  startedAt?: number;
  config: Record<string, Value>;
}

const GiB = 1024 ** 3;
const units: Record<string, number> = { "": 1, K: 1024, M: 1024 ** 2, G: GiB, T: 1024 ** 4 };

export class PveModel {
  readonly vms = new Map<number, Vm>();
  readonly created = new Map<string, number>();
  readonly tasks: Tasks;

  constructor(
    readonly node: string,
    readonly actionMs: number,
    templates: Record<string, number>,
  ) {
    this.tasks = new Tasks(node, actionMs);
    for (const [name, vmid] of Object.entries(templates)) {
      this.vms.set(vmid, {
        vmid,
        status: "stopped",
        config: {
          name,
          template: 1,
          cores: 1,
          memory: "2048",
          scsihw: "virtio-scsi-pci",
          scsi0: `local-lvm:base-${vmid}-disk-0,size=2G`,
          ide2: `local-lvm:vm-${vmid}-cloudinit,media=cdrom`,
          boot: "order=scsi0",
          net0: `virtio=${mac(vmid)},bridge=vmbr0`,
          ostype: "l26",
        },
      });
    }
  }

  close() {
    this.tasks.close();
  }

  vm(node: string, vmid: number): Vm {
    this.checkNode(node);
    const vm = this.vms.get(vmid);
    if (!vm) throw new PveFail(500, `Configuration file 'nodes/${node}/qemu-server/${vmid}.conf' does not exist`);
    return vm;
  }

  checkNode(node: string) {
    if (node !== this.node) throw new PveFail(500, `hostname lookup '${node}' failed - failed to get address info for: ${node}: Name or service not known`);
  }

  freeVmid(from = 100): number {
    let id = from;
    while (this.vms.has(id)) id++;
    return id;
  }

  taskStatus(node: string, upid: string) {
    this.checkNode(node);
    return this.tasks.status(upid);
  }

  taskLog(node: string, upid: string, start: number, limit: number) {
    this.checkNode(node);
    return this.tasks.log(upid, start, limit);
  }

  clone(node: string, vmid: number, p: Record<string, string>, user: string): string {
    const source = this.vm(node, vmid);
    const errors: Record<string, string> = {};
    const newid = Number(p.newid);
    if (!/^\d+$/.test(p.newid ?? "") || newid < 100 || newid > 999_999_999) errors.newid = "value must be a VM ID between 100 and 999999999";
    if (p.name !== undefined && !/^(?=.{1,63}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$/.test(p.name)) errors.name = "value does not match the regex pattern";
    if ((p.description ?? "").length > 8192) errors.description = "value may only be 8192 characters long";
    const full = p.full === undefined ? !source.config.template : p.full === "1";
    if (p.storage !== undefined && !full) errors.storage = "parameter 'storage' not allowed for linked clones";
    if (Object.keys(errors).length) throw paramFail(errors);
    if (p.storage !== undefined && !["local-lvm", "local"].includes(p.storage)) throw new PveFail(500, `storage '${p.storage}' does not exist`);
    if (p.target !== undefined && p.target !== this.node) throw new PveFail(500, `no such cluster node '${p.target}'`);
    if (this.vms.has(newid)) throw new PveFail(500, `unable to create VM ${newid}: config file already exists`);

    const task = this.tasks.start("qmclone", vmid, user);
    // The worker checks again once it holds the lock: a clone racing for the same VMID fails there.
    this.tasks.later(Math.max(1, Math.min(5, this.actionMs / 4)), () => {
      if (this.vms.has(newid)) return this.tasks.finish(task, `unable to create VM ${newid}: config file already exists`);
      const src = this.vms.get(vmid);
      if (!src) return this.tasks.finish(task, `Configuration file 'nodes/${node}/qemu-server/${vmid}.conf' does not exist`);
      const config: Record<string, Value> = { ...src.config, name: p.name ?? `Copy-of-VM-${src.config.name}` };
      delete config.template;
      if (p.description !== undefined) config.description = p.description;
      const storage = p.storage ?? "local-lvm";
      config.scsi0 = String(src.config.scsi0).replace(/^[^:]+:[^,]+/, `${storage}:vm-${newid}-disk-0`);
      config.ide2 = `${storage}:vm-${newid}-cloudinit,media=cdrom`;
      config.net0 = String(src.config.net0).replace(/=[0-9A-F:]{17}/, `=${mac(newid)}`);
      const vm: Vm = { vmid: newid, status: "stopped", lock: "clone", config };
      this.vms.set(newid, vm);
      const instanceId = readMarker(config.description).instanceId;
      if (instanceId) this.created.set(instanceId, (this.created.get(instanceId) ?? 0) + 1);
      task.log.push(`create full clone of drive scsi0 (${src.config.scsi0})`);
      this.tasks.later(this.actionMs, () => {
        if (vm.lock === "clone") delete vm.lock;
        this.tasks.finish(task);
      });
    });
    return task.upid;
  }

  getConfig(node: string, vmid: number) {
    const vm = this.vm(node, vmid);
    const config = { ...vm.config };
    if (config.cipassword !== undefined) config.cipassword = "**********";
    return { ...config, ...(vm.lock ? { lock: vm.lock } : {}), digest: digest(vm.config) };
  }

  /** POST (a qmconfig task) and PUT (synchronous, null) update the config alike; a locked VM refuses both. */
  setConfig(node: string, vmid: number, p: Record<string, string>, user: string, asTask: boolean): string | null {
    const vm = this.vm(node, vmid);
    const { set, remove } = validateConfig(p);
    if (vm.lock) throw new PveFail(500, `VM is locked (${vm.lock})`);
    if (p.digest !== undefined && p.digest !== digest(vm.config))
      throw new PveFail(500, "detected modified configuration - file changed by other user? Try again.");
    for (const key of remove) delete vm.config[key];
    Object.assign(vm.config, set);
    return asTask ? this.tasks.run("qmconfig", vmid, user, () => undefined) : null;
  }

  resize(node: string, vmid: number, p: Record<string, string>, user: string): string {
    const vm = this.vm(node, vmid);
    const size = /^(\+)?(\d+(?:\.\d+)?)([KMGT]?)$/.exec(p.size ?? "");
    if (!p.disk || !size)
      throw paramFail({
        ...(p.disk ? {} : { disk: "property is missing and it is not optional" }),
        ...(size ? {} : { size: "value does not match the regex pattern" }),
      });
    if (vm.lock) throw new PveFail(500, `VM is locked (${vm.lock})`);
    const drive = vm.config[p.disk];
    if (typeof drive !== "string") throw new PveFail(500, `disk '${p.disk}' does not exist`);
    if (/media=cdrom/.test(drive)) throw new PveFail(500, "you can't resize a cdrom");
    const current = diskBytes(drive);
    const amount = Math.floor(Number(size[2]) * (units[size[3] ?? ""] ?? 1));
    const next = size[1] ? current + amount : amount;
    if (next < current) throw new PveFail(500, "shrinking disks is not supported");
    vm.config[p.disk] = drive.replace(/size=[^,]+/, `size=${formatSize(next)}`);
    return this.tasks.run("resize", vmid, user, () => undefined);
  }

  power(node: string, vmid: number, action: "start" | "stop" | "shutdown", user: string): string {
    const vm = this.vm(node, vmid);
    if (vm.config.template) throw new PveFail(500, "you can't start a vm if it's a template");
    if (vm.lock) throw new PveFail(500, `VM is locked (${vm.lock})`);
    const type = { start: "qmstart", stop: "qmstop", shutdown: "qmshutdown" }[action];
    return this.tasks.run(type, vmid, user, () => {
      const now = this.vms.get(vmid);
      if (!now) return `Configuration file 'nodes/${node}/qemu-server/${vmid}.conf' does not exist`;
      if (action === "start") {
        if (now.status === "running") return `VM ${vmid} already running`;
        now.status = "running";
        now.startedAt = Date.now();
        return undefined;
      }
      if (action === "shutdown" && now.status !== "running") return `VM ${vmid} not running`;
      now.status = "stopped";
      delete now.startedAt;
      return undefined;
    });
  }

  current(node: string, vmid: number) {
    const vm = this.vm(node, vmid);
    const c = vm.config;
    return {
      vmid,
      status: vm.status,
      qmpstatus: vm.status,
      name: c.name,
      cpus: Number(c.cores ?? 1),
      maxmem: memoryMib(c.memory) * 1024 * 1024,
      maxdisk: diskBytes(String(c.scsi0 ?? "")),
      uptime: vm.startedAt ? Math.floor((Date.now() - vm.startedAt) / 1000) : 0,
      ha: { managed: 0 },
      ...(agentOn(c.agent) ? { agent: 1 } : {}),
      ...(c.tags ? { tags: c.tags } : {}),
      ...(c.template ? { template: 1 } : {}),
      ...(vm.lock ? { lock: vm.lock } : {}),
    };
  }

  interfaces(node: string, vmid: number) {
    const vm = this.vm(node, vmid);
    if (vm.status !== "running") throw new PveFail(500, `VM ${vmid} is not running`);
    if (!agentOn(vm.config.agent)) throw new PveFail(500, "No QEMU guest agent configured");
    const ip = `10.${(vmid >> 16) & 255}.${(vmid >> 8) & 255}.${vmid & 255}`;
    return {
      result: [
        { name: "lo", "hardware-address": "00:00:00:00:00:00", "ip-addresses": [{ "ip-address": "127.0.0.1", "ip-address-type": "ipv4", prefix: 8 }] },
        {
          name: "eth0",
          "hardware-address": mac(vmid).toLowerCase(),
          "ip-addresses": [
            { "ip-address": ip, "ip-address-type": "ipv4", prefix: 24 },
            { "ip-address": `fe80::be24:11ff:fe00:${(vmid & 0xffff).toString(16)}`, "ip-address-type": "ipv6", prefix: 64 },
          ],
        },
      ],
    };
  }

  destroy(node: string, vmid: number, user: string): string {
    const vm = this.vm(node, vmid);
    if (vm.status === "running") throw new PveFail(500, `VM ${vmid} is running - destroy failed`);
    if (vm.lock) throw new PveFail(500, `VM is locked (${vm.lock})`);
    // destroy_vm marks the config `lock: destroyed` while it frees the disks; the config goes last.
    vm.lock = "destroyed";
    return this.tasks.run("qmdestroy", vmid, user, () => {
      if (this.vms.get(vmid) === vm) this.vms.delete(vmid);
      return undefined;
    });
  }

  row(vm: Vm) {
    const c = vm.config;
    return {
      id: `qemu/${vm.vmid}`,
      type: "qemu",
      vmid: vm.vmid,
      node: this.node,
      name: c.name,
      status: vm.status,
      template: c.template ? 1 : 0,
      maxcpu: Number(c.cores ?? 1),
      maxmem: memoryMib(c.memory) * 1024 * 1024,
      maxdisk: diskBytes(String(c.scsi0 ?? "")),
      mem: 0,
      cpu: 0,
      uptime: vm.startedAt ? Math.floor((Date.now() - vm.startedAt) / 1000) : 0,
      ...(c.tags ? { tags: c.tags } : {}),
      ...(vm.lock ? { lock: vm.lock } : {}),
    };
  }

  /** A running VM labelled as a create of ours would label it, made outside any create (an orphan, or another deployment's). */
  plant(instanceId: string, managedBy: string, reuse?: number): number {
    const vmid = reuse ?? this.freeVmid();
    this.vms.set(vmid, {
      vmid,
      status: "running",
      startedAt: Date.now(),
      config: {
        name: `planted-${vmid}`,
        description: markerText(instanceId, managedBy),
        tags: joinTags([managedTag, instanceTag(instanceId)]),
        cores: 1,
        memory: "1024",
        scsi0: `local-lvm:vm-${vmid}-disk-0,size=10G`,
        boot: "order=scsi0",
        net0: `virtio=${mac(vmid)},bridge=vmbr0`,
        agent: "1",
        ipconfig0: "ip=dhcp",
      },
    });
    return vmid;
  }
}

export const agentOn = (v: unknown) => /^(1|enabled=1)\b/.test(String(v ?? ""));
const memoryMib = (v: unknown) => Number(/(\d+)/.exec(String(v ?? ""))?.[1] ?? 512);
const mac = (vmid: number) => `BC:24:11:${hex8(vmid).slice(2).match(/../g)?.join(":")}`;
const digest = (config: Record<string, Value>) => createHash("sha1").update(JSON.stringify(config)).digest("hex");

function diskBytes(drive: string): number {
  const m = /size=(\d+(?:\.\d+)?)([KMGT]?)/.exec(drive);
  return m ? Math.floor(Number(m[1]) * (units[m[2] ?? ""] ?? 1)) : 0;
}

function formatSize(bytes: number): string {
  for (const u of ["T", "G", "M", "K"]) {
    const n = units[u] as number;
    if (bytes % n === 0) return `${bytes / n}${u}`;
  }
  return String(bytes);
}
