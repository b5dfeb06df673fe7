import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { ProviderErrorKind } from "../../core/pools/provider/contract.ts";
import type { EmulatedMachine, EmulatorOptions, ProviderEmulator } from "../emulator.ts";
import { PveModel } from "./emulator-model.ts";
import { PveFail, paramFail } from "./emulator-params.ts";
import { readMarker } from "./labels.ts";

/**
 * A Proxmox VE API emulator: a `node:http` server on 127.0.0.1 with the cluster in memory. Real PVE serves
 * https on port 8006; this serves plain http, and the client takes any base URL (`<url>/api2/json`).
 *
 * Modelled, as the PVE API documents and its code behaves:
 * - API-token auth (`Authorization: PVEAPIToken=user@realm!name=secret`): 401 `No ticket` without it, 401
 *   `authentication failure` for a wrong one (without PVE's 3 s delay). No tickets, no CSRF, no permissions.
 * - The envelope: `{data}` on success; errors carry the text in the HTTP reason phrase and in the body as
 *   `{data:null, message, errors?}`. Unknown paths are 501 `Method '<M> <path>' not implemented`.
 * - GET /cluster/nextid (lowest free VMID ≥ 100, as a JSON string; `?vmid=` answers 400 when taken; nothing
 *   is reserved, so two callers get the same id); GET /cluster/resources (VM and node rows; `?type=`).
 * - One node (`pve`) with template VMs 9000 `debian-12` and 9001 `ubuntu-24.04`; GET /nodes/{node}/qemu.
 * - POST …/qemu/{vmid}/clone: a taken `newid` → 500 `unable to create VM <id>: config file already exists`
 *   at once, and again inside the qmclone task (so a race fails the task); the new VM shows `lock: clone`
 *   until the task ends; `storage` only for full clones.
 * - Tasks: UPIDs in PVE's 9-field format with the trailing colon; GET /nodes/{node}/tasks/{upid}/status
 *   (running, then stopped with `exitstatus` after `actionMs`) and …/log.
 * - GET/POST/PUT …/qemu/{vmid}/config: known keys validated (400 with `errors`), tags normalised, `sshkeys`
 *   checked as URI-encoded OpenSSH keys, `digest`, `delete`; POST answers a qmconfig UPID, PUT null; a
 *   locked VM → 500 `VM is locked (<lock>)`. PUT …/resize grows only and answers a UPID.
 * - POST …/status/{start,stop,shutdown} → a UPID; the state changes when the task ends (start of a running
 *   VM fails the task `VM <id> already running`). GET …/status/current. GET …/agent/network-get-interfaces
 *   (a running VM with `agent=1` has a 10.x address; stopped → 500 `VM <id> is not running`).
 * - DELETE …/qemu/{vmid}: running → 500 `VM <id> is running - destroy failed`; otherwise `lock: destroyed`
 *   during the qmdestroy task, then gone. A missing VM → 500 `Configuration file … does not exist`.
 * - rateLimit(): models a proxy in front (PVE itself has no request limit): 429 with Retry-After (seconds).
 * - failNext(): capacity = a clone task failing on `insufficient free space` (other ops: 500 `not enough
 *   space`); quota = 500 `… quota exceeded …` (PVE has no quotas; the client maps "quota" text to quota);
 *   auth = 401; invalid = 400 with `errors`; transient = 500 `can't lock file … got timeout` or 503.
 *   failRandomly() answers that transient error to a random share of requests, before they take effect.
 *
 * Left out: tickets, ACLs and 403s, clusters of several nodes, migration, linked-clone storage rules beyond
 * the one above, snapshots, pools, HA, LXC, disk contents, cloud-init drives being built, the 3 s delay on a
 * failed login, TLS.
 */

const tokenId = "root@pam!bc";
const templates = { "debian-12": 9000, "ubuntu-24.04": 9001 };
type Op = "create" | "get" | "start" | "stop" | "delete" | "list";

export async function startProxmoxEmulator(opts: EmulatorOptions = {}): Promise<ProviderEmulator> {
  const actionMs = opts.actionMs ?? 200;
  const secret = randomUUID();
  const model = new PveModel("pve", actionMs, templates);
  const faults: { op: Op | "any"; kind: ProviderErrorKind; times: number }[] = [];
  let served = 0;
  let limited = 0;
  let randomFraction = 0;
  let budget: { limit: number; windowMs: number } | null = null;
  let stamps: number[] = [];

  const server = createServer((req, res) => {
    void handle(req, res).catch((e) => answerError(res, e instanceof PveFail ? e : new PveFail(500, String(e))));
  });

  async function handle(req: IncomingMessage, res: ServerResponse) {
    served++;
    const url = new URL(req.url ?? "/", "http://emulator");
    const method = req.method ?? "GET";
    if (budget) {
      const now = Date.now();
      stamps = stamps.filter((t) => t > now - (budget?.windowMs ?? 0));
      if (stamps.length >= budget.limit) {
        limited++;
        res.setHeader("Retry-After", String(Math.max(1, Math.ceil(((stamps[0] ?? now) + budget.windowMs - now) / 1000))));
        throw new PveFail(429, "Too Many Requests");
      }
      stamps.push(now);
    }
    const auth = req.headers.authorization;
    if (!auth) throw new PveFail(401, "No ticket");
    const token = /^PVEAPIToken=([^=]+)=(.+)$/.exec(auth);
    if (!token || token[1] !== tokenId || token[2] !== secret) throw new PveFail(401, "authentication failure");
    const params = { ...Object.fromEntries(url.searchParams), ...(await body(req)) };
    if (!url.pathname.startsWith("/api2/json/")) throw new PveFail(501, `Method '${method} ${url.pathname}' not implemented`);
    const path = url.pathname.slice("/api2/json/".length).split("/").map(decodeURIComponent);
    const route = routeOf(method, path, params, token[1]);
    if (!route) throw new PveFail(501, `Method '${method} /${path.join("/")}' not implemented`);
    if (Math.random() < randomFraction) throw transientFail(route.vmid);
    const fault = route.op ? takeFault(route.op) : undefined;
    const data = fault ? faultAnswer(fault, route, token[1]) : route.run();
    res.writeHead(200, { "Content-Type": "application/json;charset=UTF-8" });
    res.end(JSON.stringify({ data }));
  }

  function routeOf(method: string, p: string[], params: Record<string, string>, user: string) {
    const r = (op: Op | null, run: () => unknown, vmid?: number) => ({ op, run, vmid });
    const [a, b, c, d, e, f] = p;
    const key = `${method} ${p.length} ${a}/${c ?? ""}/${e ?? ""}`;
    if (a === "cluster" && p.length === 2 && method === "GET") {
      if (b === "nextid") return r(null, () => nextid(params.vmid));
      if (b === "resources") return r("list", () => resources(params.type));
    }
    if (a !== "nodes" || !b) return null;
    const node = b;
    if (c === "tasks" && d && p.length === 5 && method === "GET") {
      if (e === "status") return r(null, () => model.taskStatus(node, d));
      if (e === "log") return r(null, () => model.taskLog(node, d, Number(params.start ?? 0), Number(params.limit ?? 50)));
    }
    if (c !== "qemu") return null;
    if (p.length === 3 && method === "GET")
      return r(null, () => {
        model.checkNode(node);
        return [...model.vms.values()].map((vm) => {
          const { id: _id, type: _type, node: _node, maxcpu: cpus, ...rest } = model.row(vm);
          return { ...rest, cpus };
        });
      });
    const vmid = Number(d);
    if (!/^\d+$/.test(d ?? "")) return null;
    switch (key) {
      case "DELETE 4 nodes/qemu/":
        return r("delete", () => model.destroy(node, vmid, user), vmid);
      case "POST 5 nodes/qemu/clone":
        return r("create", () => model.clone(node, vmid, params, user), vmid);
      case "GET 5 nodes/qemu/config":
        return r(null, () => model.getConfig(node, vmid), vmid);
      case "POST 5 nodes/qemu/config":
      case "PUT 5 nodes/qemu/config":
        return r(null, () => model.setConfig(node, vmid, params, user, method === "POST"), vmid);
      case "PUT 5 nodes/qemu/resize":
        return r(null, () => model.resize(node, vmid, params, user), vmid);
    }
    if (e === "status" && p.length === 6) {
      if (method === "GET" && f === "current") return r("get", () => model.current(node, vmid), vmid);
      if (method === "POST" && (f === "start" || f === "stop" || f === "shutdown"))
        return r(f === "shutdown" ? null : f, () => model.power(node, vmid, f, user), vmid);
    }
    if (e === "agent" && f === "network-get-interfaces" && method === "GET") return r(null, () => model.interfaces(node, vmid), vmid);
    return null;
  }

  function nextid(wanted: string | undefined) {
    if (wanted === undefined) return String(model.freeVmid());
    const id = Number(wanted);
    if (!/^\d+$/.test(wanted) || id < 100 || id > 999_999_999) throw paramFail({ vmid: "value must be a VM ID between 100 and 999999999" });
    if (model.vms.has(id)) throw paramFail({ vmid: `VM ${id} already exists` });
    return String(id);
  }

  function resources(type: string | undefined) {
    if (type !== undefined && !["vm", "node", "storage", "sdn"].includes(type))
      throw paramFail({ type: "value 'x' does not have a value in the enumeration 'vm, storage, node, sdn'" });
    const vms = type === undefined || type === "vm" ? [...model.vms.values()].map((vm) => model.row(vm)) : [];
    const nodes = type === undefined || type === "node" ? [{ id: `node/${model.node}`, type: "node", node: model.node, status: "online" }] : [];
    return [...vms, ...nodes];
  }

  function takeFault(op: Op) {
    const i = faults.findIndex((f) => f.op === op || f.op === "any");
    const fault = faults[i];
    if (!fault) return undefined;
    if (--fault.times <= 0) faults.splice(i, 1);
    return fault;
  }

  function faultAnswer(fault: { kind: ProviderErrorKind; op: Op | "any" }, route: { op: Op | null; vmid?: number }, user: string): unknown {
    const id = route.vmid ?? 0;
    switch (fault.kind) {
      case "auth":
        throw new PveFail(401, "authentication failure");
      case "invalid":
        throw paramFail({ [route.op === "create" ? "newid" : "vmid"]: "invalid format - value does not look like a valid VM ID" });
      case "quota":
        throw new PveFail(500, "pool 'better-compute' quota exceeded: VM limit reached");
      case "transient":
        throw transientFail(route.vmid);
      case "capacity":
        if (route.op === "create") {
          const newid = model.freeVmid();
          return model.tasks.run(
            "qmclone",
            id,
            user,
            () => `clone failed: lvcreate 'pve/vm-${newid}-disk-0' error: Volume group "pve" has insufficient free space (512 extents): 2560 required.`,
          );
        }
        throw new PveFail(500, "storage 'local-lvm' is full: not enough space");
    }
  }

  await new Promise<void>((resolve) => server.listen(opts.port ?? 0, "127.0.0.1", () => resolve()));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

  return {
    provider: "proxmox-ve",
    url,
    config: { endpoint: `${url}/api2/json`, tokenId, node: model.node, templates },
    credentials: { tokenSecret: secret },
    images: Object.keys(templates),
    actionMs,
    machines: () =>
      [...model.vms.values()]
        .filter((vm) => !vm.config.template)
        .map((vm): EmulatedMachine => {
          const marker = readMarker(vm.config.description);
          return { externalId: String(vm.vmid), name: String(vm.config.name ?? ""), ...marker, status: vm.lock ?? vm.status };
        }),
    createdPerInstance: () => new Map(model.created),
    failNext: (op, kind, times = 1) => void faults.push({ op, kind, times }),
    failRandomly: (fraction) => {
      randomFraction = fraction;
    },
    rateLimit: (limit, windowMs) => {
      budget = { limit, windowMs };
      stamps = [];
    },
    rateLimited: () => limited,
    destroyBehindBack: (externalId) => void model.vms.delete(Number(externalId)),
    powerOffBehindBack: (externalId) => {
      const vm = model.vms.get(Number(externalId));
      if (vm) {
        vm.status = "stopped";
        delete vm.startedAt;
      }
    },
    plant: async (instanceId, managedBy, reuse) => String(model.plant(instanceId, managedBy, reuse === undefined ? undefined : Number(reuse))),
    requests: () => served,
    close: async () => {
      model.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function transientFail(vmid?: number): PveFail {
  return vmid !== undefined && Math.random() < 0.5
    ? new PveFail(500, `can't lock file '/var/lock/qemu-server/lock-${vmid}.conf' - got timeout`)
    : new PveFail(503, "Service Unavailable");
}

async function body(req: IncomingMessage): Promise<Record<string, string>> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const text = Buffer.concat(chunks).toString("utf8");
  if (!text) return {};
  if ((req.headers["content-type"] ?? "").includes("application/json")) {
    const json = JSON.parse(text) as Record<string, unknown>;
    return Object.fromEntries(Object.entries(json).map(([k, v]) => [k, String(v)]));
  }
  return Object.fromEntries(new URLSearchParams(text));
}

function answerError(res: ServerResponse, e: PveFail) {
  if (res.headersSent) return res.destroy();
  // PVE's clients read the reason phrase; Node refuses one with control characters.
  res.statusCode = e.status;
  res.statusMessage = e.message.replace(/[^\x20-\x7e]/g, " ").slice(0, 200);
  res.setHeader("Content-Type", "application/json;charset=UTF-8");
  res.end(JSON.stringify({ data: null, message: `${e.message}\n`, ...(e.errors ? { errors: e.errors } : {}) }));
}
