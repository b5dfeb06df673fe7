import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WebSocket } from "ws";
import type { Principal } from "../../core/auth/principal.ts";
import { type EventFilter, headPosition, type WatchedEvent } from "../../core/instances/events.ts";
import {
  CreateApiTokenDocument,
  CreateInstanceDocument,
  CreateJoinTokenDocument,
  JoinNodeDocument,
  RevokeApiTokenDocument,
  StartInstanceDocument,
  StopInstanceDocument,
  watchInstance,
  watchInstanceEvents,
} from "../../sdk/client.ts";
import { type App, startServer } from "../../server/app.ts";
import type { Sink } from "../../server/live/feed.ts";
import { LiveHub } from "../../server/live/hub.ts";
import { expectCode, type Harness, startHarness } from "../support/harness.ts";
import { EVENT_FIELDS, headCursor, watcher } from "../support/live.ts";
import { admin } from "../support/pg.ts";

type Ev = {
  cursor: string;
  fromState: string | null;
  toState: string;
  reason: string;
  actor: string;
  version: number;
  instance: { id: string; state: string };
};
/** Someone holding a revocable credential named `key`, for a hub driven directly. */
const credentialOf = (key: string): Principal => ({
  identityId: key,
  tenantId: null,
  operator: false,
  scopes: new Set(),
  credential: { key, expiresAt: null },
});

const EVENTS = `subscription($poolId: ID, $projectId: ID, $after: String) { instanceEvents(poolId: $poolId, projectId: $projectId, after: $after) { ${EVENT_FIELDS} } }`;
const CHANGED = `subscription($id: ID!, $after: String) { instanceChanged(id: $id, after: $after) { ${EVENT_FIELDS} } }`;

/** Flip an instance's desired state `n` times: one event each. */
async function flip(client: Harness["operator"], id: string, n: number, from = 0) {
  for (let i = from; i < from + n; i++) {
    if (i % 2 === 0) await client.request(StopInstanceDocument, { id });
    else await client.request(StartInstanceDocument, { id });
  }
}

/** A tenant, a hosted pool, and one instance of that tenant's in it. */
async function tenantWithInstance(h: Harness, extra: { userData?: string } = {}) {
  const t = await h.tenant();
  const pool = await h.hostedPool();
  const inst = (await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, ...extra } }))
    .createInstance;
  return { t, inst };
}

const versions = (evs: Ev[]) => evs.map((e) => e.version);
/** Events a hosted create writes: created, then scheduled and placed in the same write (placed at admission). */
const C = 3;
const range = (a: number, b: number) => Array.from({ length: b - a + 1 }, (_, i) => a + i);

describe.each([
  ["on Redis", {}],
  ["embedded, on the in-memory bus", { REDIS_URL: "" }],
])("instance events %s", (_name, env) => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(env);
  });
  afterAll(async () => h?.close());

  it("delivers each change with the instance, from/to state, reason, actor, version and cursor", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const w = watcher<Ev>(h.url, t.token, EVENTS, { after: await headCursor(t.client) });
    const inst = (await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } })).createInstance;
    await flip(t.client, inst.id, 2);
    await expect.poll(() => w.events.length, { timeout: 10_000, interval: 20 }).toBe(5);
    expect(w.events).toMatchObject([
      { fromState: null, toState: "PENDING", desiredState: "RUNNING", reason: "created", actor: t.identityId, version: 1 },
      { fromState: "PENDING", toState: "SCHEDULING", desiredState: "RUNNING", reason: "schedule", actor: "admission", version: 2 },
      { fromState: "SCHEDULING", toState: "PROVISIONING", desiredState: "RUNNING", reason: "placed", actor: "admission", version: 3 },
      { fromState: "PROVISIONING", toState: "PROVISIONING", desiredState: "STOPPED", reason: "requested:stopped", version: 4 },
      { fromState: "PROVISIONING", toState: "PROVISIONING", desiredState: "RUNNING", reason: "requested:running", version: 5 },
    ]);
    expect(w.events.every((e) => e.instance.id === inst.id)).toBe(true);
    expect(new Set(w.events.map((e) => e.cursor)).size).toBe(5);
    expect(w.errors).toEqual([]);
    await w.dispose();
  });

  it("writes a subscription's live events as graphql-ws frames until the client completes it, and only then", async () => {
    const { t, inst } = await tenantWithInstance(h);
    // A raw graphql-transport-ws connection: the test sees every frame the server writes, for whichever id.
    const ws = new WebSocket(h.url.replace(/^http/, "ws"), "graphql-transport-ws");
    const frames: { id?: string; type: string; payload?: { data?: { instanceChanged: Ev } } }[] = [];
    ws.on("message", (m) => frames.push(JSON.parse(String(m))));
    await new Promise((r) => ws.once("open", r));
    ws.send(JSON.stringify({ type: "connection_init", payload: { authorization: `Bearer ${t.token}` } }));
    await expect.poll(() => frames.map((f) => f.type), { timeout: 5000, interval: 20 }).toContain("connection_ack");
    const subscribe = (id: string) => ws.send(JSON.stringify({ id, type: "subscribe", payload: { query: CHANGED, variables: { id: inst.id } } }));
    const seen = (id: string) => frames.filter((f) => f.id === id && f.type === "next").map((f) => f.payload?.data?.instanceChanged.version);
    subscribe("a");
    await expect.poll(() => h.app.hub.subscriptions(), { timeout: 5000, interval: 20 }).toBeGreaterThan(0);
    await flip(t.client, inst.id, 2);
    await expect.poll(() => seen("a"), { timeout: 10_000, interval: 20 }).toEqual([C + 1, C + 2]);
    ws.send(JSON.stringify({ id: "a", type: "complete" }));
    subscribe("b");
    await expect.poll(() => h.app.hub.subscriptions(), { timeout: 5000, interval: 20 }).toBe(1);
    await flip(t.client, inst.id, 2, 2);
    await expect.poll(() => seen("b"), { timeout: 10_000, interval: 20 }).toEqual([C + 3, C + 4]);
    expect(seen("a")).toEqual([C + 1, C + 2]);
    expect(frames.filter((f) => f.type === "error")).toEqual([]);
    expect(ws.readyState).toBe(WebSocket.OPEN);
    ws.close();
  });

  it("resumes after a dropped connection with every missed event, none twice, in version order", async () => {
    const { t, inst } = await tenantWithInstance(h);
    const first = watcher<Ev>(h.url, t.token, CHANGED, { id: inst.id, after: "0" });
    await flip(t.client, inst.id, 3);
    await expect.poll(() => versions(first.events), { timeout: 10_000, interval: 20 }).toEqual(range(1, C + 3));
    first.socket?.terminate();
    await expect.poll(() => first.closed?.code, { timeout: 5000, interval: 20 }).toBe(1006);
    // Missed while away.
    await flip(t.client, inst.id, 5, 3);
    const last = first.events.at(-1)?.cursor as string;
    const again = watcher<Ev>(h.url, t.token, CHANGED, { id: inst.id, after: last });
    await expect.poll(() => versions(again.events), { timeout: 10_000, interval: 20 }).toEqual(range(C + 4, C + 8));
    await flip(t.client, inst.id, 2, 8);
    await expect.poll(() => versions(again.events), { timeout: 10_000, interval: 20 }).toEqual(range(C + 4, C + 10));
    await first.dispose();
    await again.dispose();
  });
});

describe("a server's own writes", () => {
  let h: Harness;
  // No periodic poll in the way: a read it happened to make beside a write would count as a read-back.
  beforeAll(async () => {
    h = await startHarness({ LIVE_POLL_MS: "600000" });
  });
  afterAll(async () => h?.close());

  it("hands over the events of its own writes without reading them back, and reads what other processes wrote", async () => {
    const { t, inst } = await tenantWithInstance(h);
    const w = watcher<Ev>(h.url, t.token, CHANGED, { id: inst.id, after: "0" });
    await expect.poll(() => versions(w.events), { timeout: 10_000, interval: 20 }).toEqual(range(1, C));
    const { feed } = h.app.hub;
    const read = feed.readBack;
    // This server's own writes (the API's): delivered as they were written, whole.
    await flip(t.client, inst.id, 3);
    await expect.poll(() => versions(w.events), { timeout: 10_000, interval: 20 }).toEqual(range(1, C + 3));
    expect(feed.readBack).toBe(read);
    expect(w.events.at(-1)).toMatchObject({ reason: "requested:stopped", actor: t.identityId, desiredState: "STOPPED", instance: { id: inst.id } });
    // As if another process wrote them: only their bus messages arrive, and the feed reads them from the table.
    const listeners = [...h.platform.localEvents];
    h.platform.localEvents.clear();
    try {
      await flip(t.client, inst.id, 2, 3);
      await expect.poll(() => versions(w.events), { timeout: 10_000, interval: 20 }).toEqual(range(1, C + 5));
      expect(feed.readBack).toBeGreaterThanOrEqual(read + 2);
    } finally {
      for (const l of listeners) h.platform.localEvents.add(l);
    }
    // And back: the next own write follows on from what was read, none missed or repeated.
    await flip(t.client, inst.id, 2, 5);
    await expect.poll(() => versions(w.events), { timeout: 10_000, interval: 20 }).toEqual(range(1, C + 7));
    expect(w.errors).toEqual([]);
    await w.dispose();
  });
});

describe("live connections", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ LIVE_BUFFER_EVENTS: "20", LIVE_REAUTH_MS: "500" });
  });
  afterAll(async () => h?.close());

  it("never shows a tenant another tenant's events; an operator watches a whole pool", async () => {
    const a = await h.tenant();
    const b = await h.tenant();
    const pool = await h.hostedPool();
    const other = await h.hostedPool({ ipv4Range: "10.11.0.0/24" });
    const after = await headCursor(h.operator);
    const bAll = watcher<Ev>(h.url, b.token, EVENTS, { after });
    const bPool = watcher<Ev>(h.url, b.token, EVENTS, { after, poolId: pool.poolId });
    const op = watcher<Ev>(h.url, h.operatorToken, EVENTS, { after, poolId: pool.poolId });
    const aInst = (await a.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } })).createInstance;
    await flip(a.client, aInst.id, 2);
    await a.client.request(CreateInstanceDocument, { input: { poolId: other.poolId, flavor: "small", imageId: other.imageId } });
    // B's own change comes after A's: once B sees it, A's had their chance to leak.
    const bInst = (await b.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } })).createInstance;
    await expect.poll(() => bAll.events.length + bPool.events.length, { timeout: 10_000, interval: 20 }).toBe(2 * C);
    expect([...bAll.events, ...bPool.events].map((e) => e.instance.id)).toEqual(Array(2 * C).fill(bInst.id));
    await expect
      .poll(() => op.events.map((e) => e.instance.id), { timeout: 10_000, interval: 20 })
      .toEqual([...Array(C + 2).fill(aInst.id), ...Array(C).fill(bInst.id)]);

    const peek = watcher<Ev>(h.url, b.token, CHANGED, { id: aInst.id });
    await expect.poll(() => peek.errors.length, { timeout: 5000, interval: 20 }).toBe(1);
    expect(peek.errors[0]).toMatchObject({ extensions: { code: "NOT_FOUND" } });
    const noScope = await h.tenant({ scopes: ["compute:images:read"] });
    const denied = watcher<Ev>(h.url, noScope.token, EVENTS, {});
    await expect.poll(() => denied.errors[0], { timeout: 5000, interval: 20 }).toMatchObject({ extensions: { code: "FORBIDDEN" } });
    // A host agent's node credential watches nothing here.
    const { createJoinToken } = await h.operator.request(CreateJoinTokenDocument, { poolId: pool.poolId });
    const node = (await h.client().request(JoinNodeDocument, { token: createJoinToken.token, name: "watcher-node" })).joinNode;
    const agentWatch = watcher<Ev>(h.url, node.credential, EVENTS, {});
    await expect.poll(() => agentWatch.errors[0], { timeout: 5000, interval: 20 }).toMatchObject({ extensions: { code: "FORBIDDEN" } });
    const bad = watcher<Ev>(h.url, b.token, EVENTS, { after: "not-a-cursor" });
    await expect.poll(() => bad.errors[0], { timeout: 5000, interval: 20 }).toMatchObject({ extensions: { code: "INVALID_INPUT" } });
    for (const w of [bAll, bPool, op, peek, denied, agentWatch, bad]) await w.dispose();
  });

  it("re-checks each credential once per pass, however many connections share it", async () => {
    const checked: string[] = [];
    // Stands in for the database: "live" still works, "dead" was revoked without the message arriving.
    const hub = await LiveHub.start(h.platform, async (bearer) => {
      checked.push(bearer);
      return bearer === "live" ? credentialOf("live") : null;
    });
    const closed: Record<string, number[]> = { live: [], dead: [] };
    try {
      for (const bearer of ["live", "dead"])
        for (let i = 0; i < 50; i++) hub.connect({ close: (code) => closed[bearer]?.push(code), send: () => {}, readyState: 1 }, credentialOf(bearer), bearer);
      // One pass (LIVE_REAUTH_MS is 500 here) ends every connection on the dead credential...
      await expect.poll(() => closed.dead, { timeout: 5000, interval: 20 }).toEqual(Array(50).fill(4401));
      expect(closed.live).toEqual([]);
      expect(hub.connections.size).toBe(50);
      // ...having asked about each credential once, not once per connection.
      expect(checked.filter((b) => b === "dead")).toEqual(["dead"]);
      const passes = checked.filter((b) => b === "live").length;
      expect(passes).toBeGreaterThanOrEqual(1);
      expect(passes).toBeLessThanOrEqual(2);
    } finally {
      await hub.close();
    }
  });

  it("ends a connection when its token is revoked or expires, and refuses a dead token at connect", async () => {
    const t = await h.tenant();
    const { createApiToken: second } = await h.operator.request(CreateApiTokenDocument, { input: { tenantId: t.id, name: "revoke-me" } });
    const revoked = watcher<Ev>(h.url, second.token, EVENTS, {});
    await expect.poll(() => revoked.socket !== null, { timeout: 5000, interval: 20 }).toBe(true);
    await h.operator.request(RevokeApiTokenDocument, { id: second.apiToken.id });
    await expect.poll(() => revoked.closed, { timeout: 5000, interval: 20 }).toEqual({ code: 4401, reason: "credential revoked" });

    const { createApiToken: brief } = await h.operator.request(CreateApiTokenDocument, {
      input: { tenantId: t.id, name: "brief", expiresAt: new Date(Date.now() + 1500).toISOString() },
    });
    const expiring = watcher<Ev>(h.url, brief.token, EVENTS, {});
    await expect.poll(() => expiring.socket !== null, { timeout: 5000, interval: 20 }).toBe(true);
    expect(expiring.closed).toBeNull();
    await expect.poll(() => expiring.closed?.code, { timeout: 10_000, interval: 50 }).toBe(4401);

    const late = watcher<Ev>(h.url, second.token, EVENTS, {});
    await expect.poll(() => late.closed?.code, { timeout: 5000, interval: 20 }).toBe(4401);
    // The SDK's resuming watcher does not retry a credential that cannot work.
    await expectCode(watchInstanceEvents({ url: h.url, token: second.token }).next(), "UNAUTHENTICATED");
    for (const w of [revoked, expiring, late]) await w.dispose();
  });

  it("refuses a connection whose credential is revoked while the server is still checking it", async () => {
    const t = await h.tenant();
    const { createApiToken } = await h.operator.request(CreateApiTokenDocument, { input: { tenantId: t.id, name: "mid-check" } });
    // Hold the token table so the new connection's check waits on it; the revocation then reaches the server
    // (as another server's would) before the check ends and before the connection is registered.
    const holder = new pg.Client({ connectionString: h.dbUrl });
    await holder.connect();
    let conn: ReturnType<typeof watcher<Ev>> | undefined;
    try {
      await holder.query("BEGIN");
      await holder.query("LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE");
      conn = watcher<Ev>(h.url, createApiToken.token, EVENTS, {});
      const waiting = async () =>
        (await holder.query(`SELECT count(*)::int AS n FROM pg_locks WHERE NOT granted AND relation = 'api_tokens'::regclass`)).rows[0].n;
      await expect.poll(waiting, { timeout: 5000, interval: 20 }).toBeGreaterThan(0);
      const before = h.app.hub.mark();
      h.platform.bus.publish("credentialsRevoked", { key: `tok:${createApiToken.apiToken.id}` });
      await expect.poll(() => h.app.hub.mark(), { timeout: 5000, interval: 20 }).toBeGreaterThan(before);
      await holder.query("ROLLBACK");
      await expect.poll(() => conn?.closed?.code, { timeout: 5000, interval: 20 }).toBe(4401);
    } finally {
      await holder.end();
      await conn?.dispose();
    }
  });

  it("says which revocations overtook a check: this credential's, none, or more than it remembers", async () => {
    const hub = await LiveHub.start(h.platform, async () => null);
    try {
      const quiet = hub.mark();
      expect(hub.revokedSince(quiet, credentialOf("a"))).toBeNull();
      const before = hub.mark();
      hub.revoke("b");
      expect(hub.revokedSince(before, credentialOf("a"))).toBeNull();
      expect(hub.revokedSince(before, credentialOf("b"))).toBe("revoked");
      expect(hub.revokedSince(before, null)).toBeNull();
      // More than the hub remembers came after this mark: it cannot say, so the client is to try again.
      const long = hub.mark();
      for (let i = 0; i < 1100; i++) hub.revoke(`other-${i}`);
      expect(hub.revokedSince(long, credentialOf("a"))).toBe("unsure");
      expect(hub.revokedSince(hub.mark() - 5, credentialOf("a"))).toBeNull();
    } finally {
      await hub.close();
    }
  });

  it("cuts off a slow consumer while a fast one keeps up, and the slow one resumes from its cursor", async () => {
    // Large events fill the socket buffers quickly, so the backlog reaches the server's queue.
    const { t, inst } = await tenantWithInstance(h, { userData: "x".repeat(60_000) });
    const q = `subscription($id: ID!, $after: String) { instanceChanged(id: $id, after: $after) { cursor version instance { userData } } }`;
    type Big = { cursor: string; version: number };
    const fast = watcher<Big>(h.url, t.token, q, { id: inst.id, after: "0" });
    const slow = watcher<Big>(h.url, t.token, q, { id: inst.id, after: "0" });
    await expect.poll(() => fast.events.length + slow.events.length, { timeout: 10_000, interval: 20 }).toBe(2 * C);
    slow.socket?.pause();
    const flips = 600;
    await flip(t.client, inst.id, flips);
    await expect.poll(() => versions(fast.events as never), { timeout: 60_000, interval: 50 }).toEqual(range(1, flips + C));
    const metrics = async () => (await fetch(h.url.replace("/graphql", "/metrics"))).text();
    await expect.poll(metrics, { timeout: 20_000, interval: 100 }).toMatch(/bc_live_closed_total\{code="4008"\} 1/);
    slow.socket?.resume();
    await expect.poll(() => slow.closed, { timeout: 20_000, interval: 50 }).toMatchObject({ code: 4008, reason: expect.stringMatching(/slow consumer/) });
    const got = slow.events.length;
    expect(got).toBeGreaterThan(C);
    expect(got).toBeLessThan(flips + C);
    const resumed = watcher<Big>(h.url, t.token, q, { id: inst.id, after: slow.events.at(-1)?.cursor });
    await expect.poll(() => [...slow.events, ...resumed.events].map((e) => e.version), { timeout: 30_000, interval: 50 }).toEqual(range(1, flips + C));
    expect(fast.closed).toBeNull();
    for (const w of [fast, slow, resumed]) await w.dispose();
  });

  it("never repeats what a cursor already covers, even on a server whose feed is behind it", async () => {
    const { t, inst } = await tenantWithInstance(h);
    const seen = watcher<Ev>(h.url, t.token, CHANGED, { id: inst.id, after: "0" });
    await flip(t.client, inst.id, 3);
    await expect.poll(() => versions(seen.events), { timeout: 10_000, interval: 20 }).toEqual(range(1, C + 3));
    // A second replica whose feed has not caught up: the client's cursor (from the first) is ahead of it.
    const lagging = await startServer(h.platform, { port: 0, host: "127.0.0.1" });
    lagging.hub.feed.head = BigInt(seen.events[0]?.cursor as string);
    const resumed = watcher<Ev>(lagging.url, t.token, CHANGED, { id: inst.id, after: seen.events.at(-1)?.cursor });
    await expect.poll(() => lagging.hub.subscriptions(), { timeout: 5000, interval: 20 }).toBe(1);
    lagging.hub.feed.poke();
    await flip(t.client, inst.id, 1, 3);
    await expect.poll(() => versions(resumed.events), { timeout: 10_000, interval: 20 }).toEqual([C + 4]);
    await seen.dispose();
    await resumed.dispose();
    await lagging.close();
  });

  it("refuses a cursor from the future; the SDK watcher subscribes again from now and says so", async () => {
    const { t, inst } = await tenantWithInstance(h);
    const head = BigInt(await headCursor(t.client));
    const future = String(head + 1000n);
    const raw = watcher<Ev>(h.url, t.token, CHANGED, { id: inst.id, after: future });
    await expect.poll(() => raw.errors[0], { timeout: 5000, interval: 20 }).toMatchObject({ extensions: { code: "PRECONDITION_FAILED", cursor: "ahead" } });
    await raw.dispose();
    const resyncs: { cursor: string | null }[] = [];
    const base = h.app.hub.subscriptions();
    const controller = new AbortController();
    const seen: number[] = [];
    const done = (async () => {
      for await (const e of watchInstance({
        url: h.url,
        token: t.token,
        id: inst.id,
        after: future,
        signal: controller.signal,
        onResync: (w) => resyncs.push(w),
      })) {
        seen.push(e.version);
      }
    })();
    // Resynced, and subscribed again (from now) before the change is made.
    await expect.poll(() => resyncs.length === 1 && h.app.hub.subscriptions() === base + 1, { timeout: 5000, interval: 20 }).toBe(true);
    await flip(t.client, inst.id, 1);
    await expect.poll(() => seen, { timeout: 10_000, interval: 20 }).toEqual([C + 1]);
    expect(resyncs).toEqual([expect.objectContaining({ cursor: future })]);
    controller.abort();
    await done;
  });

  it("closes clients with a retryable code on shutdown; the SDK watcher resumes on the restarted server without a gap", async () => {
    const { t, inst } = await tenantWithInstance(h);
    let app: App = await startServer(h.platform, { port: 0, host: "127.0.0.1" });
    const port = Number(new URL(app.url).port);
    const reconnects: (number | null)[] = [];
    const seen: number[] = [];
    const stream = watchInstanceEvents({ url: app.url, token: t.token, after: "0", onReconnect: (w) => reconnects.push(w.code) });
    const reading = (async () => {
      for await (const e of stream) {
        if (e.instance.id !== inst.id) continue;
        seen.push(e.version);
        if (e.version === C + 11) return;
      }
    })();
    await expect.poll(() => seen, { timeout: 10_000, interval: 20 }).toEqual(range(1, C));
    await flip(t.client, inst.id, 3);
    await expect.poll(() => seen.length, { timeout: 10_000, interval: 20 }).toBe(C + 3);
    await app.close();
    // While no server listens, changes go on through the harness's own server.
    await flip(t.client, inst.id, 4, 3);
    app = await startServer(h.platform, { port, host: "127.0.0.1" });
    await flip(t.client, inst.id, 4, 7);
    await reading;
    expect(seen).toEqual(range(1, C + 11));
    expect(reconnects[0]).toBe(1012);
    await app.close();
  });
});

describe("closed connections", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness();
  });
  afterAll(async () => h?.close());

  /** Open a raw graphql-ws connection, subscribe, and resolve once the server has acknowledged it. */
  async function subscribeRaw(token: string, query: string, variables: Record<string, unknown>) {
    const ws = new WebSocket(h.url.replace(/^http/, "ws"), "graphql-transport-ws");
    await new Promise<void>((resolve, reject) => {
      ws.on("error", reject);
      ws.on("open", () => ws.send(JSON.stringify({ type: "connection_init", payload: { authorization: `Bearer ${token}` } })));
      ws.on("message", (m) => {
        if (JSON.parse(String(m)).type !== "connection_ack") return;
        ws.send(JSON.stringify({ id: "1", type: "subscribe", payload: { query, variables } }));
        resolve();
      });
    });
    return ws;
  }

  it("releases a closed connection and its subscriptions at once, even when they wait on a quiet instance or node", async () => {
    const { t, inst } = await tenantWithInstance(h);
    const pool = await h.hostedPool({ ipv4Range: "10.12.0.0/24" });
    const { createJoinToken } = await h.operator.request(CreateJoinTokenDocument, { poolId: pool.poolId });
    const node = (await h.client().request(JoinNodeDocument, { token: createJoinToken.token, name: "quiet-node" })).joinNode;
    const base = { connections: h.app.hub.connections.size, subscriptions: h.app.hub.subscriptions() };
    const sockets = [];
    for (let i = 0; i < 40; i++) sockets.push(await subscribeRaw(t.token, CHANGED, { id: inst.id }));
    const agents = [];
    for (let i = 0; i < 5; i++) agents.push(await subscribeRaw(node.credential, "subscription { nodeSpec { generation } }", {}));
    await expect.poll(() => h.app.hub.subscriptions(), { timeout: 10_000, interval: 20 }).toBe(base.subscriptions + 40);
    expect(h.app.hub.connections.size).toBe(base.connections + 45);
    for (const ws of [...sockets, ...agents]) ws.close();
    // Nothing happens to the instance or the node: the release must not wait for an event.
    await expect.poll(() => h.app.hub.connections.size, { timeout: 10_000, interval: 20 }).toBe(base.connections);
    expect(h.app.hub.subscriptions()).toBe(base.subscriptions);
    await expect.poll(() => h.app.liveOperations(), { timeout: 10_000, interval: 20 }).toBe(0);
  });
});

describe("the event feed", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness();
  });
  afterAll(async () => h?.close());

  /** A sink that counts how often the feed looks at its filter. */
  class CountingSink implements Sink {
    looks = 0;
    readonly got: WatchedEvent[] = [];
    constructor(private readonly f: EventFilter) {}
    get filter(): EventFilter {
      this.looks++;
      return this.f;
    }
    push(e: WatchedEvent): void {
      this.got.push(e);
    }
  }

  it("hands an event to the sinks it concerns without looking at the others (10,000 watchers of other instances)", async () => {
    const { t, inst } = await tenantWithInstance(h);
    const [row] = await h.platform.read((sql) =>
      sql.query<{ poolId: string; projectId: string | null }>(`SELECT pool_id AS "poolId", project_id AS "projectId" FROM instances WHERE id = $1`, [inst.id]),
    );
    const feed = h.app.hub.feed;
    // Attached once the feed has passed the create: the sinks get the flips below and nothing before them.
    await expect.poll(async () => feed.head >= (await h.platform.read(headPosition)), { timeout: 10_000, interval: 20 }).toBe(true);
    const others = Array.from({ length: 10_000 }, (_, i) => new CountingSink({ instanceId: `other-${i}` }));
    const concerned = [
      new CountingSink({ instanceId: inst.id }),
      new CountingSink({ poolId: row?.poolId as string }),
      new CountingSink({ tenantId: t.id, poolId: row?.poolId as string }),
      ...(row?.projectId ? [new CountingSink({ projectId: row.projectId })] : []),
      new CountingSink({}),
    ];
    const elsewhere = [new CountingSink({ poolId: "another-pool" }), new CountingSink({ tenantId: "another-tenant" })];
    const all = [...others, ...concerned, ...elsewhere];
    for (const s of all) feed.attach(s);
    try {
      const looked = all.map((s) => s.looks);
      await flip(t.client, inst.id, 3);
      await expect.poll(() => concerned.map((s) => s.got.length), { timeout: 10_000, interval: 20 }).toEqual(concerned.map(() => 3));
      expect(concerned.every((s) => s.got.every((e) => e.instanceId === inst.id))).toBe(true);
      expect([...others, ...elsewhere].every((s) => s.got.length === 0)).toBe(true);
      // The cost of an event grows with the subscriptions it concerns, not with every subscription on the server.
      expect(others.filter((s, i) => s.looks !== looked[i]).length).toBe(0);
    } finally {
      for (const s of all) feed.detach(s);
    }
    expect(feed.sinks.size).toBe(0);
  });
});

describe("keepalive", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ WS_KEEPALIVE_MS: "300" });
  });
  afterAll(async () => h?.close());

  it("pings every connection and drops a peer that stops answering", async () => {
    const t = await h.tenant();
    const connect = (autoPong: boolean) => {
      const ws = new WebSocket(h.url.replace(/^http/, "ws"), "graphql-transport-ws", { autoPong });
      const seen = { pings: 0, closed: null as number | null };
      ws.on("ping", () => seen.pings++);
      ws.on("close", (code) => (seen.closed = code));
      ws.on("open", () => ws.send(JSON.stringify({ type: "connection_init", payload: { authorization: `Bearer ${t.token}` } })));
      return { ws, seen };
    };
    const alive = connect(true);
    const mute = connect(false);
    await expect.poll(() => mute.seen.closed, { timeout: 10_000, interval: 50 }).toBe(1006);
    expect(mute.seen.pings).toBeGreaterThan(0);
    expect(alive.seen.pings).toBeGreaterThan(0);
    expect(alive.seen.closed).toBeNull();
    alive.ws.close();
  });
});

describe("when the database cannot be reached", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness();
  });
  afterAll(async () => h?.close());

  it("turns a connection away with a retryable code, not as a bad credential", async () => {
    const t = await h.tenant();
    const db = new URL(h.dbUrl).pathname.slice(1);
    const cut = (allow: boolean) =>
      admin(async (c) => {
        await c.query(`ALTER DATABASE "${db}" ALLOW_CONNECTIONS ${allow}`);
        if (!allow) await c.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", [db]);
      });
    await cut(false);
    try {
      const refused = watcher<Ev>(h.url, t.token, EVENTS, {});
      await expect.poll(() => refused.closed?.code, { timeout: 10_000, interval: 50 }).toBe(1013);
      await refused.dispose();
    } finally {
      await cut(true);
    }
    const ok = watcher<Ev>(h.url, t.token, EVENTS, {});
    await expect.poll(() => ok.socket !== null && ok.closed === null, { timeout: 10_000, interval: 50 }).toBe(true);
    await ok.dispose();
  });
});
