import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { logger } from "../../infra/log.ts";
import { until } from "../support/fixtures.ts";
import { type Harness, startHarness } from "../support/harness.ts";
import { watcher } from "../support/live.ts";

/**
 * Request ids and access lines, read from the JSON lines the server's one logger writes (a destination handed to
 * the platform): the id a caller sends, or one the server makes, comes back in `x-request-id` and is on every
 * line the request logs — its access line, an unexpected error — and no line carries a credential.
 */
const lines: string[] = [];
let h: Harness;
let tenant: Awaited<ReturnType<Harness["tenant"]>>;

beforeAll(async () => {
  h = await startHarness({}, { log: logger("debug", {}, { write: (line) => void lines.push(line) }) });
  tenant = await h.tenant();
});
afterAll(() => h?.close());

type Line = Record<string, unknown> & { level: string; msg: string; time: string };
const parsed = () => lines.map((l) => JSON.parse(l) as Line);
/** The one access line of request `id`, once the response has ended (it is logged on close). */
async function accessLine(id: string): Promise<Line> {
  const find = () => parsed().find((l) => l.msg === "request" && l.requestId === id);
  await until(`the access line of ${id}`, () => find() !== undefined, 5000);
  return find() as Line;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const query = (body: { query: string; operationName?: string }, headers: Record<string, string> = {}) =>
  fetch(h.url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });

describe("request ids and access lines", () => {
  it("echoes a well-formed x-request-id and logs one access line under it: operation, status, caller, no token", async () => {
    const id = "client-req.42:a_b";
    const res = await query(
      { query: "query MyInstances { instances(first: 1) { edges { node { id } } } }", operationName: "MyInstances" },
      { authorization: `Bearer ${tenant.token}`, "x-request-id": id },
    );
    expect(res.status).toBe(200);
    expect(((await res.json()) as { errors?: unknown }).errors).toBeUndefined();
    expect(res.headers.get("x-request-id")).toBe(id);
    const line = await accessLine(id);
    expect(line).toMatchObject({
      level: "info",
      method: "POST",
      path: "/graphql",
      status: 200,
      operation: "MyInstances",
      operationType: "query",
      principal: "tenant",
      tenantId: tenant.id,
    });
    expect(typeof line.ms).toBe("number");
    expect(new Date(line.time).toISOString()).toBe(line.time);
    expect(lines.filter((l) => l.includes(tenant.token) || l.includes(h.operatorToken))).toEqual([]);
  });

  it("makes an id when none is sent, and replaces one that is too long or has unsafe characters", async () => {
    const sent = await query({ query: "{ __typename }" });
    const made = sent.headers.get("x-request-id") as string;
    expect(made).toMatch(UUID);
    expect(await accessLine(made)).toMatchObject({ status: 200, principal: "anonymous", operation: "anonymous", operationType: "query" });

    for (const bad of ["has spaces", "x".repeat(129), 'quote"and\\slash', "naïve", "a,b"]) {
      const res = await query({ query: "{ __typename }" }, { "x-request-id": bad });
      const id = res.headers.get("x-request-id") as string;
      expect(id, bad).toMatch(UUID);
      await accessLine(id);
      expect(lines.some((l) => l.includes(bad))).toBe(false);
    }
  });

  it("logs a refused request with its error code and without the token it was refused for, and probes at debug", async () => {
    const res = await query({ query: "query Who { viewer { identityId } }", operationName: "Who" }, { authorization: "Bearer tok_not-a-real-one" });
    const line = await accessLine(res.headers.get("x-request-id") as string);
    expect(line).toMatchObject({ path: "/graphql", status: res.status, code: "UNAUTHENTICATED", operation: "Who" });
    expect(lines.some((l) => l.includes("tok_not-a-real-one"))).toBe(false);

    const probe = await fetch(h.url.replace(/\/graphql$/, "/healthz"));
    expect(await accessLine(probe.headers.get("x-request-id") as string)).toMatchObject({ level: "debug", path: "/healthz", status: 200 });
  });

  it("logs an unexpected error under the request's id, which the client sees in the INTERNAL error", async () => {
    const sql = (text: string) => h.platform.db.prisma.$executeRawUnsafe(text);
    await sql(`ALTER TABLE pools RENAME TO pools_elsewhere`);
    let body: { errors?: { message: string; extensions: { code: string; requestId?: string } }[] };
    let id: string;
    try {
      const res = await query({ query: "query AllPools { pools { id } }", operationName: "AllPools" }, { authorization: `Bearer ${h.operatorToken}` });
      id = res.headers.get("x-request-id") as string;
      body = (await res.json()) as typeof body;
    } finally {
      await sql(`ALTER TABLE pools_elsewhere RENAME TO pools`);
    }
    expect(body.errors?.[0]?.extensions).toEqual({ code: "INTERNAL", requestId: id });
    const error = parsed().find((l) => l.msg === "unexpected error" && l.requestId === id);
    expect(error).toMatchObject({ level: "error" });
    expect(String(error?.err)).toMatch(/pools/);
    expect(await accessLine(id)).toMatchObject({ operation: "AllPools", principal: "operator", code: "INTERNAL" });
  });
});

describe("kept-alive connections", () => {
  it("are announced for 65 s, which Node's agents (the SDK's) keep them open for, and serve request after request", async () => {
    const agent = new http.Agent({ keepAlive: true, timeout: 120_000 });
    const post = () =>
      new Promise<{ keepAlive: unknown; socket: object; timeout: number }>((resolve, reject) => {
        const req = http.request(h.url, { method: "POST", agent, headers: { "content-type": "application/json" } }, (res) => {
          res.resume();
          // The agent applies the announced time once the response ends, when it keeps the socket.
          res.on("end", () =>
            setImmediate(() => resolve({ keepAlive: res.headers["keep-alive"], socket: req.socket as object, timeout: req.socket?.timeout ?? 0 })),
          );
        });
        req.on("error", reject);
        req.end(JSON.stringify({ query: "{ __typename }" }));
      });
    try {
      const first = await post();
      const second = await post();
      expect(first.keepAlive).toBe("timeout=65");
      expect(second.socket).toBe(first.socket);
      // Node's agent closes an idle socket a second before the time the server announced.
      expect(second.timeout).toBe(64_000);
    } finally {
      agent.destroy();
    }
  });
});

describe("websocket operations", () => {
  it("logs each operation's start and end with its connection and operation ids", async () => {
    const before = lines.length;
    const live = watcher(h.url, tenant.token, "subscription Feed { instanceEvents { cursor } }", {});
    const started = () =>
      parsed()
        .slice(before)
        .find((l) => l.msg === "subscribe" && l.operation === "Feed");
    await until("the subscribe line", () => started() !== undefined, 5000);
    const s = started() as Line;
    expect(s).toMatchObject({ operationType: "subscription", principal: "tenant", tenantId: tenant.id });
    expect(s.connectionId).toMatch(UUID);
    expect(s.requestId).toMatch(UUID);
    expect(typeof s.operationId).toBe("string");
    await live.dispose();
    const completed = () => parsed().find((l) => l.msg === "complete" && l.connectionId === s.connectionId && l.operationId === s.operationId);
    await until("the complete line", () => completed() !== undefined, 5000);
    expect(lines.filter((l) => l.includes(tenant.token))).toEqual([]);
  });
});
