import { byIdOrName, IMAGES, LOCATIONS, SERVER_TYPES } from "./emulator-catalog.ts";
import { ApiError, invalidInput, labelSelector, paginate, type Reply, type Request, type Routes, readLabels, sortBy } from "./emulator-query.ts";
import type { ServerRec, World } from "./emulator-world.ts";

/** `/servers*` and `/actions*`: creation with its checks, lookups, updates, power actions and deletion. */

const HOSTNAME = /^(?=.{1,63}$)[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$/;
const notFound = (what: string) => new ApiError(404, "not_found", `${what} not found`);
const obj = (body: unknown): Record<string, unknown> => {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw new ApiError(400, "json_error", "request body must be a JSON object");
  return body as Record<string, unknown>;
};

export function serverRoutes(world: World, onCreated: (s: ServerRec) => void): Routes {
  const server = (id: string | undefined): ServerRec => {
    const s = world.servers.get(Number(id));
    if (!s) throw notFound("server");
    return s;
  };
  const unlocked = (s: ServerRec) => {
    if (world.locked(s)) throw new ApiError(423, "locked", "server is locked: another action is running");
    return s;
  };
  const nameTaken = (name: string, except?: number) => {
    for (const s of world.servers.values()) {
      if (s.name === name && s.id !== except) throw new ApiError(409, "uniqueness_error", "server name is already used", { fields: [{ name: "name" }] });
    }
  };

  const create = (req: Request): Reply => {
    const b = obj(req.body);
    if (typeof b.name !== "string" || !HOSTNAME.test(b.name)) throw invalidInput("name", "must be a valid hostname");
    if (b.server_type === undefined) throw invalidInput("server_type", "is required");
    const type = byIdOrName(SERVER_TYPES, b.server_type);
    if (!type) throw invalidInput("server_type", "unknown server type");
    if (b.image === undefined) throw invalidInput("image", "is required");
    const image = byIdOrName(IMAGES, b.image);
    if (!image) throw notFound("image");
    const location = b.location === undefined ? world.defaultLocation(type) : byIdOrName(LOCATIONS, b.location);
    if (!location) throw invalidInput("location", "unknown location");
    if (!(location.name in type.sold)) throw invalidInput("server_type", `server type ${type.name} is not sold in ${location.name}`);
    if (!type.sold[location.name]) throw new ApiError(412, "resource_unavailable", `server type ${type.name} is unavailable in ${location.name}`);
    const keys = b.ssh_keys ?? [];
    if (!Array.isArray(keys)) throw invalidInput("ssh_keys", "must be a list");
    for (const ref of keys) if (!byIdOrName([...world.keys.values()], ref)) throw invalidInput("ssh_keys", `ssh key ${String(ref)} not found`);
    if (b.user_data !== undefined && (typeof b.user_data !== "string" || Buffer.byteLength(b.user_data) > 32 * 1024)) {
      throw invalidInput("user_data", "must be a string of at most 32 KiB");
    }
    const start = b.start_after_create ?? true;
    if (typeof start !== "boolean") throw invalidInput("start_after_create", "must be a boolean");
    const labels = readLabels(b.labels);
    const net = (b.public_net ?? {}) as Record<string, unknown>;
    nameTaken(b.name);
    const s = world.addServer(
      { name: b.name, labels, type, location, image },
      { ipv4: net.enable_ipv4 !== false, ipv6: net.enable_ipv6 !== false },
      "initializing",
    );
    onCreated(s);
    const { action, next } = world.provision(s, start);
    return {
      status: 201,
      body: {
        server: world.serverJson(s),
        action: world.actionJson(action),
        next_actions: next.map((a) => world.actionJson(a)),
        root_password: keys.length ? null : world.rootPassword(),
      },
    };
  };

  const list = (req: Request): Reply => {
    const q = req.url.searchParams;
    const name = q.get("name");
    const statuses = q.getAll("status");
    const match = labelSelector(q.get("label_selector"));
    const found = [...world.servers.values()].filter(
      (s) => (name === null || s.name === name) && (statuses.length === 0 || statuses.includes(s.status)) && match(s.labels),
    );
    const sorted = sortBy(found, q.getAll("sort").length ? q.getAll("sort") : ["id"], { id: (s) => s.id, name: (s) => s.name, created: (s) => +s.created });
    const page = paginate(sorted, req.url);
    return { status: 200, body: { servers: page.items.map((s) => world.serverJson(s)), meta: page.meta }, link: page.link };
  };

  const update = (req: Request): Reply => {
    const s = server(req.params[0]);
    const b = obj(req.body);
    if (b.name !== undefined) {
      if (typeof b.name !== "string" || !HOSTNAME.test(b.name)) throw invalidInput("name", "must be a valid hostname");
      nameTaken(b.name, s.id);
    }
    const labels = b.labels === undefined ? s.labels : readLabels(b.labels);
    if (typeof b.name === "string") s.name = b.name;
    s.labels = labels;
    return { status: 200, body: { server: world.serverJson(s) } };
  };

  const power =
    (command: "start_server" | "stop_server" | "shutdown_server") =>
    (req: Request): Reply => {
      const s = unlocked(server(req.params[0]));
      if (s.status === "deleting") throw new ApiError(423, "locked", "server is being deleted");
      return { status: 201, body: { action: world.actionJson(world.power(s, command)) } };
    };

  const actionsOf = (rows: ReturnType<World["actions"]["get"]>[], req: Request): Reply => {
    const statuses = req.url.searchParams.getAll("status");
    const found = rows.filter((a) => a !== undefined && (statuses.length === 0 || statuses.includes(a.status))) as NonNullable<(typeof rows)[number]>[];
    const sorts = req.url.searchParams.getAll("sort");
    const sorted = sortBy(found, sorts.length ? sorts : ["id"], {
      id: (a) => a.id,
      command: (a) => a.command,
      status: (a) => a.status,
      started: (a) => a.started,
      finished: (a) => a.finished ?? Number.MAX_SAFE_INTEGER,
    });
    const page = paginate(sorted, req.url);
    return { status: 200, body: { actions: page.items.map((a) => world.actionJson(a)), meta: page.meta }, link: page.link };
  };

  const oneAction = (id: string | undefined, serverId?: number): Reply => {
    const a = world.actions.get(Number(id));
    if (!a || (serverId !== undefined && a.serverId !== serverId)) throw notFound("action");
    return { status: 200, body: { action: world.actionJson(a) } };
  };

  return [
    [/^\/servers$/, { GET: list, POST: create }],
    [
      /^\/servers\/(\d+)$/,
      {
        GET: (req) => ({ status: 200, body: { server: world.serverJson(server(req.params[0])) } }),
        PUT: update,
        DELETE: (req) => ({ status: 200, body: { action: world.actionJson(world.remove(unlocked(server(req.params[0])))) } }),
      },
    ],
    [
      /^\/servers\/(\d+)\/actions$/,
      {
        GET: (req) =>
          actionsOf(
            [...world.actions.values()].filter((a) => a.serverId === server(req.params[0]).id),
            req,
          ),
      },
    ],
    [/^\/servers\/(\d+)\/actions\/(\d+)$/, { GET: (req) => oneAction(req.params[1], server(req.params[0]).id) }],
    [/^\/servers\/(\d+)\/actions\/poweron$/, { POST: power("start_server") }],
    [/^\/servers\/(\d+)\/actions\/poweroff$/, { POST: power("stop_server") }],
    [/^\/servers\/(\d+)\/actions\/shutdown$/, { POST: power("shutdown_server") }],
    [
      /^\/actions$/,
      {
        GET: (req) => {
          const ids = req.url.searchParams.getAll("id");
          if (ids.length === 0) throw invalidInput("id", "at least one action id is required", 400);
          return actionsOf(
            [...new Set(ids)].map((id) => world.actions.get(Number(id))),
            req,
          );
        },
      },
    ],
    [/^\/actions\/(\d+)$/, { GET: (req) => oneAction(req.params[0]) }],
  ];
}
