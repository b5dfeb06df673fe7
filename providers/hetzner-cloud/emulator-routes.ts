import { byIdOrName, IMAGES, imageJson, LOCATIONS, SERVER_TYPES, serverTypeJson } from "./emulator-catalog.ts";
import { ApiError, invalidInput, labelSelector, paginate, type Reply, type Request, type Routes, readLabels, sortBy } from "./emulator-query.ts";

export type { Reply, Request, Routes };

import { serverRoutes } from "./emulator-servers.ts";
import type { ServerRec, World } from "./emulator-world.ts";

const KEY = /^(ssh-(rsa|ed25519|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com) [A-Za-z0-9+/]+={0,2}( .*)?$/;

/** A read-only catalog resource: list with `name=` and pages, one by id. */
function catalog<T extends { id: number; name: string }>(plural: string, singular: string, rows: T[], json: (x: T) => unknown): Routes {
  return [
    [
      new RegExp(`^/${plural}$`),
      {
        GET: (req) => {
          const name = req.url.searchParams.get("name");
          const page = paginate(
            rows.filter((r) => name === null || r.name === name),
            req.url,
          );
          return { status: 200, body: { [plural]: page.items.map(json), meta: page.meta }, link: page.link };
        },
      },
    ],
    [
      new RegExp(`^/${plural}/(\\d+)$`),
      {
        GET: (req) => {
          const row = byIdOrName(rows, Number(req.params[0]));
          if (!row) throw new ApiError(404, "not_found", `${singular.replace("_", " ")} not found`);
          return { status: 200, body: { [singular]: json(row) } };
        },
      },
    ],
  ];
}

function keyRoutes(world: World): Routes {
  const key = (id: string | undefined) => {
    const k = world.keys.get(Number(id));
    if (!k) throw new ApiError(404, "not_found", "SSH key not found");
    return k;
  };
  return [
    [
      /^\/ssh_keys$/,
      {
        GET: (req) => {
          const q = req.url.searchParams;
          const [name, fingerprint, match] = [q.get("name"), q.get("fingerprint"), labelSelector(q.get("label_selector"))];
          const found = [...world.keys.values()].filter(
            (k) => (name === null || k.name === name) && (fingerprint === null || k.fingerprint === fingerprint) && match(k.labels),
          );
          const sorts = q.getAll("sort");
          const page = paginate(sortBy(found, sorts.length ? sorts : ["id"], { id: (k) => k.id, name: (k) => k.name }), req.url);
          return { status: 200, body: { ssh_keys: page.items.map((k) => world.keyJson(k)), meta: page.meta }, link: page.link };
        },
        POST: (req) => {
          const b = (req.body ?? {}) as Record<string, unknown>;
          if (typeof b.name !== "string" || b.name.trim() === "") throw invalidInput("name", "is required");
          if (typeof b.public_key !== "string" || !KEY.test(b.public_key.trim())) throw invalidInput("public_key", "invalid public key");
          return { status: 201, body: { ssh_key: world.keyJson(world.addKey(b.name, b.public_key, readLabels(b.labels))) } };
        },
      },
    ],
    [
      /^\/ssh_keys\/(\d+)$/,
      {
        GET: (req) => ({ status: 200, body: { ssh_key: world.keyJson(key(req.params[0])) } }),
        DELETE: (req) => {
          world.keys.delete(key(req.params[0]).id);
          return { status: 204 };
        },
      },
    ],
  ];
}

/** Every endpoint the emulator answers, matched on the path below `/v1`. */
export function router(world: World, onCreated: (s: ServerRec) => void): (req: Omit<Request, "params">) => Reply {
  const routes: Routes = [
    ...serverRoutes(world, onCreated),
    ...keyRoutes(world),
    ...catalog("server_types", "server_type", SERVER_TYPES, serverTypeJson),
    ...catalog("locations", "location", LOCATIONS, (l) => l),
    ...catalog("images", "image", IMAGES, imageJson),
  ];
  return (req) => {
    for (const [pattern, methods] of routes) {
      const m = pattern.exec(req.path);
      if (!m) continue;
      const handler = methods[req.method];
      if (!handler) throw new ApiError(405, "method_not_allowed", `method ${req.method} is not allowed here`);
      return handler({ ...req, params: m.slice(1) });
    }
    throw new ApiError(404, "not_found", "no such resource");
  };
}
