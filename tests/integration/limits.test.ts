import { request as httpRequest } from "node:http";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Gate, hostLane } from "../../infra/db/lanes.ts";
import {
  CreateInstanceDocument,
  CreateJoinTokenDocument,
  createClient,
  InstanceDocument,
  InstancesDocument,
  JoinNodeDocument,
  ViewerDocument,
} from "../../sdk/client.ts";
import { startServer } from "../../server/app.ts";
import { until } from "../support/fixtures.ts";
import { type Harness, startHarness } from "../support/harness.ts";
import { startHosts, waitForState } from "../support/hosts.ts";

type Reply = {
  status: number;
  retryAfter: string | null;
  data?: Record<string, unknown> | null;
  errors?: { message: string; extensions?: { code?: string; retryAfterMs?: number; limit?: string } }[];
};

/** A raw GraphQL request: what the SDK would never send. */
async function post(url: string, body: unknown, token?: string): Promise<Reply> {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return { status: res.status, retryAfter: res.headers.get("retry-after"), ...((await res.json()) as object) };
}
const codeOf = (r: Reply) => r.errors?.[0]?.extensions?.code ?? (r.errors ? "NO CODE" : "ANSWERED");
const aliased = (n: number, field: (i: number) => string) => Array.from({ length: n }, (_, i) => `a${i}: ${field(i)}`).join(" ");
/** `__type` nested to `depth` selections (Armor leaves `__schema` alone, not `__type`). */
const deep = (depth: number) => `{ __type(name: "Query") { fields { type { ${"ofType { ".repeat(depth - 4)}name${" }".repeat(depth - 4)} } } } }`;
const INSTANCE_FIELDS =
  "id state desiredState flavor vcpus memoryMib diskGib gpus { model count } imageId sshKeys addresses conditions { type reason message } nodeId poolId tenantId version createdAt updatedAt";
const PAGES = `query Pages($n: Int) { a: instances(first: $n) { edges { cursor node { ${INSTANCE_FIELDS} } } } b: instances(first: $n) { edges { cursor node { ${INSTANCE_FIELDS} } } } }`;

describe("what one request may cost (default limits)", () => {
  let h: Harness;
  let pool: { poolId: string; imageId: string };
  beforeAll(async () => {
    h = await startHarness();
    pool = await h.hostedPool();
  });
  afterAll(() => h?.close());
  const create = (i: number) =>
    `createInstance(input: { poolId: "${pool.poolId}", flavor: "small", imageId: "${pool.imageId}", idempotencyKey: "k${i}" }) { id }`;
  const written = async (tenantId: string) => ({
    instances: await h.platform.db.prisma.instance.count({ where: { tenantId } }),
    audit: await h.platform.db.prisma.auditLog.count(),
  });

  it("refuses a request over each limit with INVALID_INPUT naming the limit, and writes nothing", async () => {
    const t = await h.tenant();
    const before = await written(t.id);
    const over: [string, unknown][] = [
      // The attack of issue 9: refused while it is parsed.
      ["tokens", { query: `{ ${aliased(1000, () => "instances(first: 500) { nodes { id state } }")} }` }],
      ["aliases", { query: `{ ${aliased(16, () => "viewer { identityId }")} }` }],
      ["depth", { query: deep(11) }],
      ["directives", { query: `{ viewer { ${"identityId @include(if: true) ".repeat(21)}} }` }],
      ["cost", { query: PAGES, variables: { n: 500 } }],
      ["mutations", { query: `mutation { ${aliased(6, create)} }` }],
    ];
    for (const [limit, body] of over) {
      const r = await post(h.url, body, t.token);
      expect(codeOf(r), limit).toBe("INVALID_INPUT");
      expect(r.errors?.[0]?.message, limit).toContain(`limits.${limit}`);
      expect(r.data ?? null, limit).toBeNull();
    }
    // 200 aliased creates in one request: refused whole, before any of them runs.
    const many = await post(h.url, { query: `mutation { ${aliased(200, create)} }` }, t.token);
    expect(codeOf(many)).toBe("INVALID_INPUT");
    expect(await written(t.id)).toEqual(before);
  });

  it("runs a request just under every limit", async () => {
    const t = await h.tenant();
    const before = await written(t.id);
    expect(codeOf(await post(h.url, { query: `{ ${aliased(15, () => "viewer { identityId }")} }` }, t.token))).toBe("ANSWERED");
    expect(codeOf(await post(h.url, { query: deep(10) }, t.token))).toBe("ANSWERED");
    expect(codeOf(await post(h.url, { query: `{ viewer { ${"identityId @include(if: true) ".repeat(20)}} }` }, t.token))).toBe("ANSWERED");
    // The cost follows the variables: the document refused above at 500 a page is answered at 100.
    expect(codeOf(await post(h.url, { query: PAGES, variables: { n: 100 } }, t.token))).toBe("ANSWERED");
    // The SDK's largest request: a full page of 500 with every field.
    await t.client.request(InstancesDocument, { first: 500 });
    const five = await post(h.url, { query: `mutation { ${aliased(5, create)} }` }, t.token);
    expect(codeOf(five)).toBe("ANSWERED");
    expect(await written(t.id)).toEqual({ instances: before.instances + 5, audit: before.audit + 5 });
  });

  it("remembers a document's cost only per value of the variables it depends on, and never a cost of variables that do not fit", async () => {
    const t = await h.tenant();
    const pages = (n: unknown, other: boolean) =>
      post(
        h.url,
        {
          query: `query Again($n: Int, $other: Boolean!) { viewer @include(if: $other) { identityId } ${PAGES.slice(PAGES.indexOf("{") + 1)}`,
          variables: { n, other },
        },
        t.token,
      );
    // Variables that do not fit are refused by execution; the cost they left (none) must not stand for the next request.
    expect(codeOf(await pages("many", true))).toBe("INVALID_INPUT");
    expect(codeOf(await pages(500, true))).toBe("INVALID_INPUT");
    expect(codeOf(await pages(100, true))).toBe("ANSWERED");
    // A variable the cost does not read changes nothing; the one it reads still counts after the cheap answer.
    expect(codeOf(await pages(100, false))).toBe("ANSWERED");
    const over = await pages(500, false);
    expect(codeOf(over)).toBe("INVALID_INPUT");
    expect(over.errors?.[0]?.message).toContain("limits.cost");
  });

  it("refuses introspection and field hints to anonymous callers, and keeps both for any credential and in development", async () => {
    const t = await h.tenant();
    for (const query of ["{ __schema { queryType { name } } }", '{ __type(name: "Query") { name } }']) {
      expect(codeOf(await post(h.url, { query }))).toBe("INVALID_INPUT");
      expect(codeOf(await post(h.url, { query }, t.token))).toBe("ANSWERED");
    }
    const anonymous = await post(h.url, { query: "{ instancez { id } }" });
    expect(codeOf(anonymous)).toBe("INVALID_INPUT");
    expect(anonymous.errors?.[0]?.message).not.toMatch(/did you mean/i);
    expect((await post(h.url, { query: "{ instancez { id } }" }, t.token)).errors?.[0]?.message).toMatch(/did you mean "instance"/i);
    // `bc dev`: a schema browser works without a token.
    const dev = await startServer({ ...h.platform, dev: true }, { port: 0, host: "127.0.0.1" });
    try {
      expect((await post(dev.url, { query: "{ __schema { queryType { name } } }" })).data).toEqual({ __schema: { queryType: { name: "Query" } } });
    } finally {
      await dev.close();
    }
  });

  it("answers what it cannot read as a request — malformed JSON, a batch, a mutation over GET, a syntax error — with INVALID_INPUT", async () => {
    const t = await h.tenant();
    const malformed = await post(h.url, "{bad", t.token);
    expect(codeOf(malformed)).toBe("INVALID_INPUT");
    expect(malformed.errors?.[0]?.message).toMatch(/invalid JSON/);
    const batch = await post(h.url, [{ query: "{ viewer { identityId } }" }, { query: "{ viewer { tenantId } }" }], t.token);
    expect(codeOf(batch)).toBe("INVALID_INPUT");
    expect(batch.errors?.[0]?.message).toMatch(/one operation per request/);
    const get = await fetch(`${h.url}?query=${encodeURIComponent(`mutation { ${create(99)} }`)}`, { headers: { authorization: `Bearer ${t.token}` } });
    const viaGet = (await get.json()) as Reply;
    expect(codeOf(viaGet)).toBe("INVALID_INPUT");
    expect(viaGet.errors?.[0]?.message).toMatch(/POST/);
    expect(codeOf(await post(h.url, { query: "{ viewer { " }, t.token))).toBe("INVALID_INPUT");
    expect(await h.platform.db.prisma.instance.count({ where: { tenantId: t.id } })).toBe(0);
  });
});

/** A POST over node:http, its body declared (content-length) or sent in chunks (transfer-encoding: chunked). */
function rawPost(url: string, token: string, chunks: string[], declared: boolean): Promise<Reply & { connection: string | undefined }> {
  const length = Buffer.byteLength(chunks.join(""));
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      url,
      { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${token}`, ...(declared ? { "content-length": length } : {}) } },
      (res) => {
        const parts: Buffer[] = [];
        res.on("data", (c: Buffer) => parts.push(c));
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, retryAfter: null, connection: res.headers.connection, ...JSON.parse(Buffer.concat(parts).toString()) }),
        );
      },
    );
    // A refusal may close the connection before the whole body is written.
    req.on("error", (e: NodeJS.ErrnoException) => (e.code === "EPIPE" || e.code === "ECONNRESET" ? undefined : reject(e)));
    for (const c of chunks) req.write(c);
    req.end();
  });
}

describe("what one request's body may be", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ LIMIT_BODY_BYTES: "4096" });
  });
  afterAll(() => h?.close());

  it("answers a body up to limits.bodyBytes; refuses a longer one (413) or one of undeclared length (411) unread, with INVALID_INPUT, and writes nothing", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const input = `{ poolId: "${pool.poolId}", flavor: "small", imageId: "${pool.imageId}", idempotencyKey: "body" }`;
    /** A create whose JSON body is exactly `bytes` long. */
    const createOf = (bytes: number) => {
      const body = (pad: string) => JSON.stringify({ query: `mutation {${pad} createInstance(input: ${input}) { id } }` });
      return body(" ".repeat(bytes - Buffer.byteLength(body(""))));
    };
    const over = await rawPost(h.url, t.token, [createOf(4097)], true);
    expect([over.status, codeOf(over), over.errors?.[0]?.extensions?.limit, over.connection]).toEqual([413, "INVALID_INPUT", "bodyBytes", "close"]);
    expect(over.errors?.[0]?.message).toMatch(/larger than 4096 bytes/);
    const body = createOf(4096);
    const chunked = await rawPost(h.url, t.token, [body.slice(0, 100), body.slice(100)], false);
    expect([chunked.status, codeOf(chunked), chunked.connection]).toEqual([411, "INVALID_INPUT", "close"]);
    expect(chunked.errors?.[0]?.message).toMatch(/content-length/);
    expect(await h.platform.db.prisma.instance.count({ where: { tenantId: t.id } })).toBe(0);
    const atLimit = await rawPost(h.url, t.token, [body], true);
    expect([atLimit.status, codeOf(atLimit)]).toEqual([200, "ANSWERED"]);
    expect(await h.platform.db.prisma.instance.count({ where: { tenantId: t.id } })).toBe(1);
  });
});

describe("what one credential may spend", () => {
  let h: Harness;
  beforeAll(async () => {
    // A small budget in a long window: nothing refills while the test runs.
    h = await startHarness({ LIMIT_RATE_POINTS: "20", LIMIT_RATE_WINDOW_S: "600" });
  });
  afterAll(() => h?.close());
  const viewer = { query: "{ viewer { identityId } }" };
  /** Requests answered before the first refusal (bounded), and that refusal. */
  async function spend(url: string, token: string, body: unknown) {
    for (let answered = 0; answered <= 100; answered++) {
      const r = await post(url, body, token);
      if (codeOf(r) !== "ANSWERED") return { answered, refusal: r };
    }
    return { answered: Number.POSITIVE_INFINITY, refusal: null };
  }

  it("answers a credential past its budget with RATE_LIMITED and when to retry; other callers, other replicas' view and hosts", async () => {
    const [a, b] = [await h.tenant(), await h.tenant()];
    const { answered, refusal } = await spend(h.url, a.token, viewer);
    expect(answered).toBe(20);
    expect(codeOf(refusal as Reply)).toBe("RATE_LIMITED");
    expect(refusal?.errors?.[0]?.extensions?.retryAfterMs).toBeGreaterThan(0);
    expect(refusal?.status).toBe(429);
    expect(Number(refusal?.retryAfter)).toBeGreaterThanOrEqual(1);
    // Another tenant's budget is its own.
    expect(codeOf(await post(h.url, viewer, b.token))).toBe("ANSWERED");
    // A second server on the same Redis draws on the same budget.
    const replica = await startServer(h.platform, { port: 0, host: "127.0.0.1" });
    try {
      expect(codeOf(await post(replica.url, viewer, a.token))).toBe("RATE_LIMITED");
    } finally {
      await replica.close();
    }
    // A host's credential answers to no tenant budget.
    const { poolId } = await h.hostedPool({ nodes: [] });
    const { createJoinToken } = await h.operator.request(CreateJoinTokenDocument, { poolId });
    const { joinNode } = await h.client().request(JoinNodeDocument, { token: createJoinToken.token, name: "limits-host" });
    const host = createClient({ url: h.url, token: joinNode.credential });
    for (let i = 0; i < 30; i++) await host.request(ViewerDocument);
  });

  it("charges an expensive request more of the budget than a cheap one", async () => {
    const t = await h.tenant();
    // instances(first: 500) { nodes { id } } costs 1 + 500 × 2: two points a request, so ten fit in twenty.
    const { answered, refusal } = await spend(h.url, t.token, { query: "{ instances(first: 500) { nodes { id } } }" });
    expect(answered).toBe(10);
    expect(codeOf(refusal as Reply)).toBe("RATE_LIMITED");
  });
});

describe("host traffic first", () => {
  it("serves host work before API work, and API callers in turn", async () => {
    const gate = new Gate(1, true);
    const order: string[] = [];
    let open!: () => void;
    const held = new Promise<void>((r) => (open = r));
    const blocker = gate.run(hostLane, () => held);
    const runs = [
      ...["a1", "a2", "a3"].map((n) => gate.run({ kind: "api", caller: "a" }, async () => void order.push(n))),
      gate.run({ kind: "api", caller: "b" }, async () => void order.push("b1")),
      gate.run(hostLane, async () => void order.push("host")),
    ];
    open();
    await Promise.all([blocker, ...runs]);
    expect(order).toEqual(["host", "a1", "b1", "a2", "a3"]);
  });

  it("lands hosts' reports and answers another tenant while one tenant's requests hold every API connection", async () => {
    // Every statement of the flood waits on a lock the test holds: it stands for statements that take long,
    // which an allowed request can make on a loaded database.
    const hosts = await startHosts(2, { LIMIT_API_CONNECTIONS: "4", LIMIT_API_STATEMENT_TIMEOUT_MS: "1000" });
    const { h } = hosts;
    const locker = new pg.Client({ connectionString: h.dbUrl });
    const observer = new pg.Client({ connectionString: h.dbUrl });
    const flood = { on: true, inFlight: 0, outcomes: new Map<string, number>() };
    try {
      await Promise.all([locker.connect(), observer.connect()]);
      const victim = await h.tenant();
      const ids: string[] = [];
      for (let i = 0; i < 3; i++) {
        const { createInstance } = await victim.client.request(CreateInstanceDocument, {
          input: { poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId, idempotencyKey: `v${i}` },
        });
        ids.push(createInstance.id);
      }
      for (const id of ids) await waitForState(victim.client, id, "RUNNING");
      const attacker = await h.tenant();

      await locker.query("BEGIN");
      await locker.query("LOCK TABLE projects IN ACCESS EXCLUSIVE MODE");
      const since = new Date();
      // More requests in flight than the database pool has connections, each renewed as soon as it returns.
      const loops = Array.from({ length: 30 }, async () => {
        while (flood.on) {
          flood.inFlight++;
          const r = await post(h.url, { query: "{ projects { id name } }" }, attacker.token);
          flood.inFlight--;
          flood.outcomes.set(codeOf(r), (flood.outcomes.get(codeOf(r)) ?? 0) + 1);
        }
      });
      let answered = false;
      const read = victim.client.request(InstanceDocument, { id: ids[0] as string }).then((r) => {
        answered = r.instance?.state === "RUNNING" && flood.on && flood.inFlight > 0;
      });
      await until("the other tenant's read to be answered during the flood", () => answered, 15_000);
      await read;
      const reported = async () =>
        (await observer.query("SELECT count(*)::int AS n FROM nodes WHERE pool_id = $1 AND last_report_at > $2", [hosts.poolId, since])).rows[0].n;
      await until("every host to report during the flood", async () => flood.inFlight > 0 && (await reported()) === 2, 15_000);

      flood.on = false;
      await locker.query("ROLLBACK");
      await Promise.all(loops);
      // The flood was answered or told to come back later; never INTERNAL.
      expect([...flood.outcomes.keys()].every((code) => code === "ANSWERED" || code === "RATE_LIMITED")).toBe(true);
      const lost = await observer.query("SELECT count(*)::int AS n FROM instance_events WHERE to_state = 'lost'");
      expect(lost.rows[0].n).toBe(0);
      for (const id of ids) await waitForState(victim.client, id, "RUNNING");
    } finally {
      flood.on = false;
      await locker.end().catch(() => {});
      await observer.end().catch(() => {});
      await hosts.close();
    }
  });
});
