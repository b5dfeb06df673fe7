import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Destinations } from "../../contracts/addresses.ts";
import { isProviderError } from "../../core/pools/provider/contract.ts";
import { parseConfig } from "../../infra/config.ts";
import { endpointRefusal, providerFetch, type Resolve } from "../../infra/provider-fetch.ts";

/** A real server on 127.0.0.1 that records what reached it. */
let server: Server;
let port = 0;
const seen: { method: string; url: string; authorization: string | undefined; body: string }[] = [];
beforeAll(async () => {
  server = createServer((req: IncomingMessage, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      seen.push({ method: req.method ?? "", url: req.url ?? "", authorization: req.headers.authorization, body });
      if (req.url === "/redirect") return void res.writeHead(302, { location: "http://169.254.169.254/latest" }).end();
      if (req.url === "/empty") return void res.writeHead(204).end();
      if (req.url === "/slow") return; // never answers
      res.writeHead(418, "I'm a teapot", { "content-type": "application/json", "x-twice": ["a", "b"] }).end(JSON.stringify({ got: body }));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  port = (server.address() as AddressInfo).port;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

const loopback = new Destinations({ allow: ["127.0.0.1/32"], allowHttp: true });
const names = (table: Record<string, string[]>): Resolve => {
  return async (host) => (table[host] ?? []).map((address) => ({ address, family: address.includes(":") ? 6 : 4 }));
};
const refusedBy = async (p: Promise<unknown>) => {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  expect(isProviderError(e) && e.kind).toBe("invalid");
  return (e as Error).message;
};

describe("the provider endpoints' guard", () => {
  it("judges an account's endpoint without DNS: https, and no address literal outside the allowed", () => {
    const none = new Destinations();
    expect(endpointRefusal("https://api.hetzner.cloud/v1", none)).toBeNull();
    expect(endpointRefusal("http://api.hetzner.cloud/v1", none)).toMatch(/must be https/);
    expect(endpointRefusal("file:///etc/passwd", none)).toMatch(/https URL/);
    expect(endpointRefusal("https://127.0.0.1:8006/api2/json", none)).toMatch(/loopback/);
    expect(endpointRefusal("https://[::ffff:169.254.169.254]/", none)).toMatch(/link-local/);
    expect(endpointRefusal("https://10.0.0.5:8006/api2/json", none)).toMatch(/private/);
    expect(endpointRefusal("https://user:pw@api.example/", none)).toMatch(/user or password/);
    expect(endpointRefusal(`http://127.0.0.1:${port}/v1`, loopback)).toBeNull();
    // A name is judged when it is called, after DNS.
    expect(endpointRefusal("https://localhost/", none)).toBeNull();
  });

  it("calls an allowed endpoint like fetch: method, headers, body, status, answer; redirects are not followed", async () => {
    const f = providerFetch(loopback);
    const res = await f(`http://127.0.0.1:${port}/v1/things?x=1`, { method: "POST", headers: { Authorization: "Bearer t" }, body: "a=1" });
    expect([res.status, res.statusText, res.ok, res.headers.get("x-twice")]).toEqual([418, "I'm a teapot", false, "a, b"]);
    expect(await res.json()).toEqual({ got: "a=1" });
    expect(seen.at(-1)).toEqual({ method: "POST", url: "/v1/things?x=1", authorization: "Bearer t", body: "a=1" });
    const moved = await f(`http://127.0.0.1:${port}/redirect`);
    expect([moved.status, moved.headers.get("location")]).toEqual([302, "http://169.254.169.254/latest"]);
    expect((await f(`http://127.0.0.1:${port}/empty`)).status).toBe(204);
  });

  it("refuses a name that resolves to any refused address, and connects only to the addresses it checked", async () => {
    const before = seen.length;
    const rebinding = names({ "api.rebind.test": ["203.0.114.7", "127.0.0.1"], "meta.test": ["169.254.169.254"], "lan.test": ["10.1.2.3"] });
    const f = providerFetch(new Destinations({ allow: [], allowHttp: true }), { resolve: rebinding });
    expect(await refusedBy(f(`http://api.rebind.test:${port}/v1`))).toMatch(/api\.rebind\.test refused: it resolves to a loopback address/);
    expect(await refusedBy(f(`http://meta.test:${port}/`))).toMatch(/link-local/);
    expect(await refusedBy(f(`http://lan.test:${port}/`))).toMatch(/private/);
    expect(await refusedBy(f(`http://127.0.0.1:${port}/`))).toMatch(/loopback/);
    expect(await refusedBy(providerFetch(new Destinations())(`http://127.0.0.1:${port}/`))).toMatch(/must be https/);
    expect(seen.length).toBe(before);
    // A name only the guard's resolver knows: reaching the server proves the connection used the checked address.
    const pinned = providerFetch(loopback, { resolve: names({ "api.pinned.invalid": ["127.0.0.1"] }) });
    expect((await pinned(`http://api.pinned.invalid:${port}/v1/x`)).status).toBe(418);
    expect(seen.length).toBe(before + 1);
  });

  it("fails as fetch does: a name not resolved is transient, a refused connection and a timeout are fetch's errors", async () => {
    const f = providerFetch(loopback, { resolve: names({}) });
    const unresolved = await f("http://nowhere.invalid/").catch((e: unknown) => e);
    expect(isProviderError(unresolved) && unresolved.kind).toBe("transient");
    const closed = await f("http://127.0.0.1:1/").catch((e: unknown) => e);
    expect(closed).toBeInstanceOf(TypeError);
    expect((closed as { cause?: { code?: string } }).cause?.code).toBe("ECONNREFUSED");
    const slow = await f(`http://127.0.0.1:${port}/slow`, { signal: AbortSignal.timeout(100) }).catch((e: unknown) => e);
    expect((slow as Error).name).toBe("TimeoutError");
  });

  it("is configured by providers.endpoints or its variables: https to public addresses by default", () => {
    expect(parseConfig().providers.endpoints).toEqual({ allowHttp: false, allow: [] });
    const c = parseConfig({ providers: { endpoints: { allow: ["10.0.0.0/8"] } } }, { PROVIDER_ENDPOINT_HTTP: "true" });
    expect(c.providers.endpoints).toEqual({ allowHttp: true, allow: ["10.0.0.0/8"] });
    expect(parseConfig({}, { PROVIDER_ENDPOINT_ALLOW: "127.0.0.1/32, fd00::/8" }).providers.endpoints.allow).toEqual(["127.0.0.1/32", "fd00::/8"]);
    expect(() => parseConfig({}, { PROVIDER_ENDPOINT_ALLOW: "localhost" })).toThrow(/providers.endpoints.allow/);
  });
});
