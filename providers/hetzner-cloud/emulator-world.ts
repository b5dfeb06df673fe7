import { createHash, randomBytes } from "node:crypto";
import { type Image, imageJson, LOCATIONS, type Location, type ServerTypeSpec, serverTypeJson } from "./emulator-catalog.ts";
import { ApiError } from "./emulator-query.ts";

/**
 * The emulated project's state: servers, their actions and SSH keys, and the clock that moves actions along.
 * Actions finish on timers; what a finished action does to its server is guarded by the status it expects, so
 * a change made behind the platform's back in between is not undone.
 */

export interface ServerRec {
  id: number;
  name: string;
  status: string;
  created: Date;
  labels: Record<string, string>;
  type: ServerTypeSpec;
  location: Location;
  image: Image;
  ipv4: { id: number; ip: string } | null;
  ipv6: { id: number; ip: string } | null;
}

export interface ActionRec {
  id: number;
  command: string;
  status: "running" | "success" | "error";
  started: number;
  durationMs: number;
  finished: number | null;
  serverId: number | null;
  error: { code: string; message: string } | null;
}

export interface KeyRec {
  id: number;
  name: string;
  publicKey: string;
  fingerprint: string;
  labels: Record<string, string>;
  created: Date;
}

const iso = (ms: number | Date) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, "+00:00");

export class World {
  readonly servers = new Map<number, ServerRec>();
  readonly actions = new Map<number, ActionRec>();
  readonly keys = new Map<number, KeyRec>();
  private readonly timers = new Set<NodeJS.Timeout>();
  private nextServerId = 1_000_001;
  private nextActionId = 5_000_001;
  private nextKeyId = 9_001;
  private nextIp = 1;

  constructor(readonly actionMs: number) {}

  /** A running action on the server locks it against another (423 `locked`). */
  locked(s: ServerRec): boolean {
    for (const a of this.actions.values()) if (a.serverId === s.id && a.status === "running") return true;
    return false;
  }

  /** Starts an action that succeeds after `durationMs` and then applies `done`; 0 finishes it at once. */
  action(command: string, serverId: number | null, durationMs: number, done: () => void = () => {}): ActionRec {
    const a: ActionRec = { id: this.nextActionId++, command, status: "running", started: Date.now(), durationMs, finished: null, serverId, error: null };
    this.actions.set(a.id, a);
    const finish = () => {
      a.status = "success";
      a.finished = Date.now();
      done();
    };
    if (durationMs <= 0) finish();
    else this.after(durationMs, finish);
    return a;
  }

  private after(ms: number, fn: () => void): void {
    const t = setTimeout(() => {
      this.timers.delete(t);
      fn();
    }, ms);
    this.timers.add(t);
  }

  /** Guarded transition: only if the server still exists and is where the action left it. */
  private move(id: number, from: string, to: string): void {
    const s = this.servers.get(id);
    if (s?.status === from) s.status = to;
  }

  addServer(init: Omit<ServerRec, "id" | "created" | "ipv4" | "ipv6" | "status">, net: { ipv4: boolean; ipv6: boolean }, status: string): ServerRec {
    const n = this.nextIp++;
    // Benchmarking (198.18.0.0/15) and documentation (2001:db8::/32) ranges: never someone's real address.
    const ipv4 = net.ipv4 ? { id: 40_000_000 + n, ip: `198.${18 + ((n >> 16) & 1)}.${(n >> 8) & 255}.${n & 255}` } : null;
    const ipv6 = net.ipv6 ? { id: 60_000_000 + n, ip: `2001:db8:${n.toString(16)}::/64` } : null;
    const s: ServerRec = { ...init, id: this.nextServerId++, created: new Date(), status, ipv4, ipv6 };
    this.servers.set(s.id, s);
    return s;
  }

  /** Build, then (if asked) boot: `initializing` for one action's time, `starting` for another, then `running`. */
  provision(s: ServerRec, start: boolean): { action: ActionRec; next: ActionRec[] } {
    const action = this.action("create_server", s.id, this.actionMs, () => this.move(s.id, "initializing", start ? "starting" : "off"));
    // The boot ends running even if its timer fires before the build's (a loaded event loop runs both late, in
    // either order): a server left `starting` for good was what a fault run once found.
    const next = start
      ? [
          this.action("start_server", s.id, 2 * this.actionMs, () => {
            this.move(s.id, "initializing", "running");
            this.move(s.id, "starting", "running");
          }),
        ]
      : [];
    return { action, next };
  }

  power(s: ServerRec, command: "start_server" | "stop_server" | "shutdown_server"): ActionRec {
    const on = command === "start_server";
    const [via, to] = on ? ["starting", "running"] : ["stopping", "off"];
    if (s.status === to) return this.action(command, s.id, 0);
    s.status = via;
    return this.action(command, s.id, this.actionMs, () => this.move(s.id, via, to));
  }

  remove(s: ServerRec): ActionRec {
    s.status = "deleting";
    return this.action("delete_server", s.id, this.actionMs, () => {
      if (this.servers.get(s.id)?.status === "deleting") this.servers.delete(s.id);
    });
  }

  addKey(name: string, publicKey: string, labels: Record<string, string>): KeyRec {
    const blob = publicKey.trim().split(/\s+/)[1] ?? "";
    const md5 = createHash("md5").update(Buffer.from(blob, "base64")).digest("hex");
    const fingerprint = (md5.match(/../g) ?? []).join(":");
    for (const k of this.keys.values()) {
      if (k.name === name) throw new ApiError(409, "uniqueness_error", "SSH key with the same name already exists", { fields: [{ name: "name" }] });
      if (k.fingerprint === fingerprint)
        throw new ApiError(409, "uniqueness_error", "SSH key with the same fingerprint already exists", { fields: [{ name: "public_key" }] });
    }
    const k: KeyRec = { id: this.nextKeyId++, name, publicKey: publicKey.trim(), fingerprint, labels, created: new Date() };
    this.keys.set(k.id, k);
    return k;
  }

  actionJson(a: ActionRec) {
    const progress = a.status === "running" ? Math.min(99, Math.floor(((Date.now() - a.started) / a.durationMs) * 100)) : 100;
    return {
      id: a.id,
      command: a.command,
      status: a.status,
      progress,
      started: iso(a.started),
      finished: a.finished === null ? null : iso(a.finished),
      resources: a.serverId === null ? [] : [{ id: a.serverId, type: "server" }],
      error: a.error,
    };
  }

  serverJson(s: ServerRec) {
    return {
      id: s.id,
      name: s.name,
      status: s.status,
      created: iso(s.created),
      public_net: {
        ipv4: s.ipv4 && { id: s.ipv4.id, ip: s.ipv4.ip, blocked: false, dns_ptr: `static.${s.ipv4.ip.split(".").reverse().join(".")}.clients.example` },
        ipv6: s.ipv6 && { id: s.ipv6.id, ip: s.ipv6.ip, blocked: false, dns_ptr: [] },
        floating_ips: [],
        firewalls: [],
      },
      private_net: [],
      server_type: serverTypeJson(s.type),
      location: s.location,
      image: imageJson(s.image),
      iso: null,
      rescue_enabled: false,
      locked: this.locked(s),
      backup_window: null,
      outgoing_traffic: 0,
      ingoing_traffic: 0,
      included_traffic: 20 * 1024 ** 4,
      protection: { delete: false, rebuild: false },
      labels: s.labels,
      volumes: [],
      load_balancers: [],
      primary_disk_size: s.type.disk,
      placement_group: null,
    };
  }

  keyJson(k: KeyRec) {
    return { id: k.id, name: k.name, fingerprint: k.fingerprint, public_key: k.publicKey, labels: k.labels, created: iso(k.created) };
  }

  /** A password the API would mail when no SSH key is given; random so nothing can rely on it. */
  rootPassword(): string {
    return randomBytes(12).toString("base64url");
  }

  defaultLocation(type: ServerTypeSpec): Location | undefined {
    return LOCATIONS.find((l) => type.sold[l.name] === true);
  }

  close(): void {
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
  }
}
