import type { Machine, MachineStatus } from "../../core/pools/provider/contract.ts";
import type { ProxmoxConfig } from "./config.ts";
import { missing, type PveApi, PveError } from "./http.ts";
import { type Marker, readMarker } from "./labels.ts";

/** Where a VM lives: PVE addresses every VM call through its node. */
export interface Ref {
  vmid: number;
  node: string;
}

/** A `/cluster/resources?type=vm` row, the cluster-wide list with names, tags, locks and power state. */
export interface Row extends Ref {
  type?: string;
  name?: string;
  status?: string;
  template?: number;
  tags?: string;
  lock?: string;
}

/** `status/current`: what the VM is doing now. */
export interface Current {
  status?: string;
  qmpstatus?: string;
  lock?: string;
  name?: string;
  agent?: number | string;
}

export type Config = Record<string, unknown>;

/** What a VM's config says of it, kept per VMID while its name stays the same, so get() costs no config read. */
interface Info {
  node: string;
  name: string | undefined;
  marker: Marker;
  agent: boolean;
  staticIps: string[];
}

export const agentOn = (v: unknown) => /^(1|enabled=1)\b/.test(String(v ?? ""));

/**
 * Our status from PVE's: a clone holds lock `clone` until the VM is built, destroy holds `destroyed`; a power
 * change shows only in the task we started, so that task (when we know of one) says starting or stopping.
 */
export function statusOf(cur: Current, task?: string): MachineStatus {
  if (cur.lock === "clone" || cur.lock === "create") return "creating";
  if (cur.lock === "destroyed" || task === "qmdestroy") return "deleting";
  if (task === "qmstart") return "starting";
  if (task === "qmstop" || task === "qmshutdown") return "stopping";
  if (cur.lock && ["migrate", "rollback", "suspending", "suspended"].includes(cur.lock)) return "unknown";
  if (cur.status === "running") return !cur.qmpstatus || cur.qmpstatus === "running" ? "running" : "unknown";
  if (cur.status === "stopped") return "stopped";
  return "unknown";
}

export class Vms {
  /** Power and destroy tasks this session started, per VMID, until they are seen to stop. */
  readonly pending = new Map<number, { upid: string; type: string }>();
  private readonly info = new Map<number, Info>();

  constructor(
    readonly api: PveApi,
    readonly config: ProxmoxConfig,
  ) {}

  qemu(ref: Ref, suffix = ""): string {
    return `/nodes/${encodeURIComponent(ref.node)}/qemu/${ref.vmid}${suffix}`;
  }

  async rows(): Promise<Row[]> {
    const rows = (await this.api.get<Row[]>("/cluster/resources", { type: "vm" })) ?? [];
    return rows.filter((r) => r.type === undefined || r.type === "qemu");
  }

  readConfig(ref: Ref): Promise<Config> {
    return this.api.get<Config>(this.qemu(ref, "/config")).then((c) => c ?? {});
  }

  /** The VM's state, asked of the node it was last seen on (the account's node at first); null when PVE has no such VM. */
  async current(vmid: number): Promise<{ ref: Ref; cur: Current } | null> {
    const first = this.info.get(vmid)?.node ?? this.config.node;
    const at = async (node: string) => ({ ref: { vmid, node }, cur: (await this.api.get<Current>(this.qemu({ vmid, node }, "/status/current"))) ?? {} });
    try {
      return await at(first);
    } catch (e) {
      if (!missing(e)) throw e;
    }
    // Not on that node: it may have migrated, or it is gone.
    const row = (await this.rows()).find((r) => r.vmid === vmid);
    if (!row || row.node === first) return this.forget(vmid);
    try {
      return await at(row.node);
    } catch (e) {
      if (missing(e)) return this.forget(vmid);
      throw e;
    }
  }

  forget(vmid: number): null {
    this.info.delete(vmid);
    return null;
  }

  /** Reads the configs of these rows (a few at a time) for their markers; VMs that vanished meanwhile are left out. */
  async labelled(rows: Row[]): Promise<{ row: Row; marker: Marker }[]> {
    const out: { row: Row; marker: Marker }[] = [];
    let next = 0;
    const worker = async () => {
      for (let row = rows[next++]; row; row = rows[next++]) {
        // A VM keeps its description for life, so one read per VMID and name will do.
        const cached = this.info.get(row.vmid);
        const fresh = cached && cached.node === row.node && cached.name === row.name;
        const info = fresh
          ? cached
          : await this.learn(row, row.name).catch((e) => {
              if (missing(e)) return null;
              throw e;
            });
        if (info) out.push({ row, marker: info.marker });
      }
    };
    await Promise.all(Array.from({ length: Math.min(4, rows.length) }, worker));
    return out.sort((a, b) => a.row.vmid - b.row.vmid);
  }

  /** The machine with this VMID as get() shows it, or null when PVE has none (also when it went between two reads). */
  async look(vmid: number): Promise<Machine | null> {
    const found = await this.current(vmid);
    if (!found) return null;
    try {
      return await this.machine(found.ref, found.cur);
    } catch (e) {
      if (missing(e)) return this.forget(vmid);
      throw e;
    }
  }

  private async machine(ref: Ref, first: Current): Promise<Machine> {
    let cur = first;
    const cached = this.info.get(ref.vmid);
    const info = cached && cached.node === ref.node && cached.name === cur.name ? cached : await this.learn(ref, cur.name);
    const pending = cur.lock ? undefined : this.pending.get(ref.vmid);
    const task = pending ? await this.runningTask(ref.vmid) : undefined;
    // The task ended between reading the VM and asking after it: the VM as read is from before its end.
    if (pending && !task) cur = (await this.api.get<Current>(this.qemu(ref, "/status/current"))) ?? cur;
    const agent = cur.agent === undefined ? info.agent : agentOn(cur.agent);
    const addresses = cur.status === "running" && agent ? await this.agentAddresses(ref, info.staticIps) : info.staticIps;
    return { externalId: String(ref.vmid), instanceId: info.marker.instanceId, status: statusOf(cur, task), addresses };
  }

  /** A machine from its resources row alone (for list, where asking every VM's agent would cost a request each). */
  rowMachine(row: Row, marker: Marker): Machine {
    const task = this.pending.get(row.vmid);
    return {
      externalId: String(row.vmid),
      instanceId: marker.instanceId,
      status: statusOf({ status: row.status, lock: row.lock }, task?.type),
      addresses: this.info.get(row.vmid)?.staticIps ?? [],
    };
  }

  private async learn(ref: Ref, name: string | undefined): Promise<Info> {
    const cfg = await this.readConfig(ref);
    const info: Info = {
      node: ref.node,
      name: typeof cfg.name === "string" ? cfg.name : name,
      marker: readMarker(cfg.description),
      agent: agentOn(cfg.agent),
      staticIps: staticIps(cfg.ipconfig0),
    };
    this.info.set(ref.vmid, info);
    return info;
  }

  private async runningTask(vmid: number): Promise<string | undefined> {
    const task = this.pending.get(vmid);
    if (!task) return undefined;
    const node = task.upid.split(":")[1] ?? this.config.node;
    const state = await this.api
      .get<{ status?: string }>(`/nodes/${encodeURIComponent(node)}/tasks/${encodeURIComponent(task.upid)}/status`)
      .catch(() => ({ status: "unknown" }));
    if (state?.status === "running") return task.type;
    this.pending.delete(vmid);
    return undefined;
  }

  /**
   * The guest agent's addresses, IPv4 first; a VM without a working agent falls back to its static ipconfig0.
   * Only PVE's own answer that the agent cannot answer (a 500: not running, a QMP timeout) means that. A refusal
   * before the question reached the VM (a rate limit, the network, a proxy) says nothing of its addresses and
   * fails the look: taken as "no agent", it would swap the addresses to the fallback and back with every refusal.
   */
  private async agentAddresses(ref: Ref, fallback: string[]): Promise<string[]> {
    type Iface = { name?: string; "ip-addresses"?: { "ip-address"?: string; "ip-address-type"?: string }[] };
    const answer = await this.api.get<{ result?: Iface[] }>(this.qemu(ref, "/agent/network-get-interfaces")).catch((e: unknown) => {
      if (e instanceof PveError && e.code === "500") return null;
      throw e;
    });
    const ifaces = answer?.result ?? [];
    const all = ifaces.filter((i) => i.name !== "lo").flatMap((i) => i["ip-addresses"] ?? []);
    const v4 = all.filter((a) => a["ip-address-type"] === "ipv4").map((a) => a["ip-address"] ?? "");
    const v6 = all.filter((a) => a["ip-address-type"] === "ipv6").map((a) => a["ip-address"] ?? "");
    const found = [...v4.filter((a) => a && !/^(127\.|169\.254\.)/.test(a)), ...v6.filter((a) => a && a !== "::1" && !/^fe80:/i.test(a))];
    return found.length ? found : fallback;
  }
}

function staticIps(ipconfig: unknown): string[] {
  const parts = new Map<string, string>();
  for (const part of String(ipconfig ?? "").split(",")) {
    const [k, v] = part.split("=");
    if (k && v) parts.set(k, v);
  }
  return [parts.get("ip"), parts.get("ip6")].filter((ip): ip is string => !!ip && ip !== "dhcp" && ip !== "auto").map((ip) => ip.split("/")[0] ?? ip);
}
