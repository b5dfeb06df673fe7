/**
 * A Hetzner Cloud API emulator: a real HTTP server on 127.0.0.1 answering under `/v1` from memory, for the
 * plugin's tests, the quick start and the conformance suite. Shapes follow the public API reference.
 *
 * Models:
 * - Auth: `Authorization: Bearer <token>` with one generated 64-character token; anything else is 401 `unauthorized`.
 * - Errors: the `{"error":{code,message,details}}` envelope with the documented statuses: 400 `json_error`,
 *   `invalid_input` (query parameters); 401 `unauthorized`; 403 `resource_limit_exceeded`; 404 `not_found`;
 *   405 `method_not_allowed`; 409 `uniqueness_error`; 412 `resource_unavailable`; 422 `invalid_input`;
 *   423 `locked`; 429 `rate_limit_exceeded`; 503 `unavailable`.
 * - `POST /servers`: name (RFC 1123, unique → 409), server_type / image / location by id or name (unknown type
 *   or location → 422, unknown image → 404 not_found, type not sold in the location → 422, sold but marked
 *   unavailable → 412 resource_unavailable), ssh_keys by id or name (unknown → 422), user_data ≤ 32 KiB, labels,
 *   start_after_create, public_net.enable_ipv4/ipv6. Answers 201 {server, action, next_actions, root_password}.
 * - `GET /servers` with `name=`, `status=`, `label_selector` (`k==v`, `k=v`, `k!=v`, `k`, `!k`, `k in (…)`,
 *   `k notin (…)`, `,` = AND), `sort=id|name|created[:asc|:desc]`, `page`/`per_page` (25 by default, at most
 *   50), `meta.pagination` with its six keys and a `Link` header. `GET`, `PUT {name?, labels?}` (labels replace
 *   the set) and `DELETE` (200 {action}) on `/servers/{id}`; the full server object shape.
 * - Power: `POST /servers/{id}/actions/{poweron,poweroff,shutdown}` → 201 {action}. Actions: `GET /actions?id=…`
 *   (id required), `GET /actions/{id}`, `GET /servers/{id}/actions[/{id}]`. An action runs for `actionMs`
 *   (progress rising, then `success`); the server follows: initializing → starting → running (or → off without
 *   start_after_create; create plus boot take two action times), starting → running, stopping → off, deleting →
 *   gone. While one of its actions runs a server is `locked: true` and power actions and DELETE answer 423.
 * - Catalog: `GET /server_types[/{id}]` (cx22, cx32, cx42, cpx11, and a deprecated cx11; decimal-string prices;
 *   per-location availability), `GET /locations[/{id}]` (fsn1, nbg1, hel1), `GET /images[/{id}]`
 *   (ubuntu-24.04, ubuntu-22.04, debian-12), each with `name=` and pages.
 * - `/ssh_keys`: POST (unique by name and by MD5 fingerprint → 409), GET with `name=`, `fingerprint=`,
 *   `label_selector`; GET and DELETE one.
 * - `RateLimit-Limit`/`-Remaining`/`-Reset` (UNIX seconds until the budget is full) on every response; unmetered
 *   (3600/3600) until `rateLimit()` sets a bucket refilled evenly over its window.
 *
 * Leaves out: every other resource (networks, volumes, firewalls, floating and primary IPs, load balancers,
 * placement groups, certificates, ISOs, datacenters), reboot/reset/rebuild/rescue/resize and other server
 * actions, protection flags and 423 `protected`, architecture checks between image and server type, project
 * resource limits (403 only on request via failNext), `image` filters other than `name`, `X-Correlation-Id`
 * tracing beyond a random value, and failures that happen after the change was made (injected failures change
 * nothing).
 */
import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { ProviderErrorKind } from "../../core/pools/provider/contract.ts";
import type { EmulatedMachine, EmulatorOptions, ProviderEmulator } from "../emulator.ts";
import { IMAGES, LOCATIONS, SERVER_TYPES } from "./emulator-catalog.ts";
import { ApiError, invalidInput } from "./emulator-query.ts";
import { type Reply, router } from "./emulator-routes.ts";
import { World } from "./emulator-world.ts";

type Op = Parameters<ProviderEmulator["failNext"]>[0];

const INJECTED: Record<ProviderErrorKind, () => ApiError> = {
  capacity: () => new ApiError(412, "resource_unavailable", "the requested resource is currently unavailable"),
  quota: () => new ApiError(403, "resource_limit_exceeded", "server limit exceeded", { limits: [{ name: "server_limit" }] }),
  auth: () => new ApiError(401, "unauthorized", "unable to authenticate"),
  invalid: () => invalidInput("server_type", "server type is not valid for this request"),
  transient: () => new ApiError(503, "unavailable", "service temporarily unavailable"),
};

/** Which plugin operation a request belongs to, for failNext. */
function opOf(method: string, path: string): Op | null {
  if (path === "/servers") return method === "POST" ? "create" : method === "GET" ? "list" : null;
  if (/^\/servers\/\d+$/.test(path)) return method === "GET" ? "get" : method === "DELETE" ? "delete" : null;
  const power = /^\/servers\/\d+\/actions\/(poweron|poweroff|shutdown)$/.exec(path);
  if (power && method === "POST") return power[1] === "poweron" ? "start" : "stop";
  return null;
}

export async function startHetznerEmulator(opts: EmulatorOptions = {}): Promise<ProviderEmulator> {
  const actionMs = opts.actionMs ?? 200;
  const token = randomBytes(48).toString("base64url");
  const world = new World(actionMs);
  const created = new Map<string, number>();
  const route = router(world, (s) => {
    const instance = s.labels["bc-instance"];
    if (instance) created.set(instance, (created.get(instance) ?? 0) + 1);
  });

  let served = 0;
  let limited = 0;
  let randomFraction = 0;
  const failures: { op: Op; kind: ProviderErrorKind; left: number }[] = [];
  let bucket: { limit: number; windowMs: number; tokens: number; at: number } | null = null;

  const refill = (now: number) => {
    if (!bucket) return;
    bucket.tokens = Math.min(bucket.limit, bucket.tokens + ((now - bucket.at) * bucket.limit) / bucket.windowMs);
    bucket.at = now;
  };
  const rateHeaders = (now: number): Record<string, string> => {
    if (!bucket) return { "RateLimit-Limit": "3600", "RateLimit-Remaining": "3600", "RateLimit-Reset": String(Math.floor(now / 1000)) };
    refill(now);
    const untilFull = ((bucket.limit - bucket.tokens) * bucket.windowMs) / bucket.limit;
    return {
      "RateLimit-Limit": String(bucket.limit),
      "RateLimit-Remaining": String(Math.floor(bucket.tokens)),
      "RateLimit-Reset": String(Math.ceil((now + untilFull) / 1000)),
    };
  };

  const answer = (req: IncomingMessage, raw: Buffer): Reply => {
    const url = new URL(req.url ?? "/", "http://127.0.0.1");
    const method = req.method ?? "GET";
    if (!url.pathname.startsWith("/v1/")) throw new ApiError(404, "not_found", "no such resource");
    const path = url.pathname.slice(3).replace(/\/+$/, "");
    if (req.headers.authorization !== `Bearer ${token}`) throw new ApiError(401, "unauthorized", "unable to authenticate");
    if (bucket) {
      refill(Date.now());
      if (bucket.tokens < 1) {
        limited++;
        throw new ApiError(429, "rate_limit_exceeded", "limit of requests per hour reached");
      }
      bucket.tokens -= 1;
    }
    const op = opOf(method, path);
    const planned = failures.find((f) => f.op === "any" || f.op === op);
    if (planned) {
      if (--planned.left <= 0) failures.splice(failures.indexOf(planned), 1);
      throw INJECTED[planned.kind]();
    }
    if (randomFraction > 0 && Math.random() < randomFraction) throw INJECTED.transient();
    let body: unknown;
    if (raw.length > 0) {
      try {
        body = JSON.parse(raw.toString("utf8"));
      } catch {
        throw new ApiError(400, "json_error", "request body is not valid JSON");
      }
    }
    return route({ method, path, url, body });
  };

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    served++;
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    let reply: Reply;
    try {
      reply = answer(req, Buffer.concat(chunks));
    } catch (e) {
      const err = e instanceof ApiError ? e : new ApiError(500, "server_error", "internal server error");
      reply = { status: err.status, body: err };
    }
    const headers: Record<string, string> = { ...rateHeaders(Date.now()), "X-Correlation-Id": randomBytes(8).toString("hex") };
    if (reply.link) headers.Link = reply.link;
    if (reply.body === undefined) {
      res.writeHead(reply.status, headers).end();
      return;
    }
    res.writeHead(reply.status, { ...headers, "Content-Type": "application/json" }).end(JSON.stringify(reply.body));
  };

  const server = createServer((req, res) => {
    handle(req, res).catch(() => res.destroy());
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 0, "127.0.0.1", () => resolve());
  });
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  let planted = 0;

  return {
    provider: "hetzner-cloud",
    url,
    config: { endpoint: url },
    credentials: { token },
    images: IMAGES.map((i) => i.name),
    actionMs,
    machines: (): EmulatedMachine[] =>
      [...world.servers.values()].map((s) => ({
        externalId: String(s.id),
        name: s.name,
        instanceId: s.labels["bc-instance"] ?? null,
        managedBy: s.labels["bc-managed-by"] ?? null,
        status: s.status,
      })),
    createdPerInstance: () => new Map(created),
    failNext(op, kind, times = 1) {
      failures.push({ op, kind, left: times });
    },
    failRandomly(fraction) {
      randomFraction = Math.min(1, Math.max(0, fraction));
    },
    rateLimit(limit, windowMs) {
      bucket = { limit, windowMs, tokens: limit, at: Date.now() };
    },
    rateLimited: () => limited,
    destroyBehindBack(externalId) {
      world.servers.delete(Number(externalId));
    },
    powerOffBehindBack(externalId) {
      const s = world.servers.get(Number(externalId));
      if (s) s.status = "off";
    },
    async plant(instanceId, managedBy, reuse) {
      const names = new Set([...world.servers.values()].map((s) => s.name));
      let name: string;
      do name = `planted-${++planted}`;
      while (names.has(name));
      const [type, location, image] = [SERVER_TYPES[0]!, LOCATIONS[0]!, IMAGES[0]!];
      const labels = { "bc-instance": instanceId, "bc-managed-by": managedBy };
      const s = world.addServer({ name, labels, type, location, image }, { ipv4: true, ipv6: true }, "running");
      if (reuse !== undefined) {
        // Hetzner Cloud never reuses a server id; the emulator can, to test what a provider that does would do.
        world.servers.delete(s.id);
        s.id = Number(reuse);
        world.servers.set(s.id, s);
      }
      return String(s.id);
    },
    requests: () => served,
    async close() {
      world.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
