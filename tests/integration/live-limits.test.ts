import { createClient as createGraphqlWs } from "graphql-ws";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WebSocket } from "ws";
import { CreateApiTokenDocument, CreateInstanceDocument } from "../../sdk/client.ts";
import { until } from "../support/fixtures.ts";
import { type Harness, startHarness } from "../support/harness.ts";
import { EVENT_FIELDS, watcher } from "../support/live.ts";
import { walk } from "../support/reconcile.ts";

/** Subscriptions pay like queries: the budget, the caps on what a caller holds open, and what a socket may send. */

type Reply = { status: number; errors?: { message: string; extensions?: { code?: string; retryAfterMs?: number; limit?: string } }[] };
async function post(url: string, query: string, token?: string): Promise<Reply> {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
    body: JSON.stringify({ query }),
  });
  return { status: res.status, ...((await res.json()) as object) };
}
const codeOf = (r: Reply) => r.errors?.[0]?.extensions?.code ?? "ANSWERED";
const VIEWER = "{ viewer { identityId } }";
const EVENTS = `subscription($after: String) { instanceEvents(after: $after) { ${EVENT_FIELDS} } }`;

/** `viewer` requests answered before the first refusal (bounded). */
async function answeredBeforeRefusal(url: string, token: string): Promise<{ answered: number; refusal: Reply | null }> {
  for (let answered = 0; answered <= 200; answered++) {
    const r = await post(url, VIEWER, token);
    if (codeOf(r) !== "ANSWERED") return { answered, refusal: r };
  }
  return { answered: Number.POSITIVE_INFINITY, refusal: null };
}

/** Accepted (a source opened, or events came) or refused, within a bound. */
async function settled(h: Harness, w: ReturnType<typeof watcher>, open: number) {
  await until("the subscription accepted or refused", () => w.errors.length > 0 || w.events.length > 0 || w.closed !== null || h.app.liveOperations() > open);
}
const errorOf = (w: ReturnType<typeof watcher>) => w.errors[0] as { extensions?: { code?: string; limit?: string; retryAfterMs?: number } } | undefined;

/** A second token of the tenant: a budget of its own. */
async function secondToken(h: Harness, tenantId: string): Promise<string> {
  const { createApiToken } = await h.operator.request(CreateApiTokenDocument, { input: { tenantId, name: "second" } });
  return createApiToken.token;
}

describe("subscriptions spend the caller's budget", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ LIMIT_RATE_POINTS: "30", LIMIT_RATE_WINDOW_S: "600" });
  });
  afterAll(() => h?.close());

  it("charges each subscription at subscribe time, and refuses one past the budget (sandboxExec included) before it runs", async () => {
    const t = await h.tenant();
    const watchers = [];
    for (let i = 0; i < 10; i++) {
      const open = h.app.liveOperations();
      const w = watcher(h.url, t.token, EVENTS, {});
      await settled(h, w, open);
      expect(w.errors).toEqual([]);
      watchers.push(w);
    }
    // Ten subscriptions spent ten of thirty points: twenty requests are left.
    const { answered, refusal } = await answeredBeforeRefusal(h.url, t.token);
    expect(answered).toBe(20);
    expect(codeOf(refusal as Reply)).toBe("RATE_LIMITED");

    const commands = async () => (await h.platform.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM host_commands`)))[0]?.n;
    const before = await commands();
    for (const [query, variables] of [
      [EVENTS, {}],
      ['subscription($id: ID!) { sandboxExec(sandboxId: $id, command: ["cat", "/etc/passwd"]) { stream data } }', { id: "sbx_made_up" }],
    ] as const) {
      const open = h.app.liveOperations();
      const w = watcher(h.url, t.token, query, variables);
      await settled(h, w, open);
      expect(errorOf(w)?.extensions?.code, query).toBe("RATE_LIMITED");
      expect(errorOf(w)?.extensions?.retryAfterMs).toBeGreaterThan(0);
      await w.dispose();
    }
    expect(await commands()).toBe(before);
    for (const w of watchers) await w.dispose();
  });

  it("costs a replay by what it replays, read a page at a time on the caller's lane, not the hosts'", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const { createInstance } = await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } });
    const cycles = Array.from({ length: 100 }, () => ["stopped", "starting", "running"]).flat();
    await walk(h.platform, createInstance.id, ["starting", "running", ...cycles]);
    const total = 3 + 2 + cycles.length;

    const replayer = await secondToken(h, t.id);
    const lanes: string[] = [];
    const api = h.platform.api.bind(h.platform);
    h.platform.api = (caller) => {
      const lane = api(caller);
      const read: typeof lane.read = (fn) => {
        lanes.push(caller);
        return lane.read(fn);
      };
      return { ...lane, read };
    };
    try {
      const w = watcher(h.url, replayer, EVENTS, { after: "0" });
      await until("the whole history replayed", () => w.events.length >= total || w.errors.length > 0);
      expect(w.errors).toEqual([]);
      const versions = w.events.map((e) => (e as { version: number }).version);
      expect(versions).toEqual(versions.map((_, i) => i + 1));
      await w.dispose();
    } finally {
      h.platform.api = api;
    }
    // Every read of the replay went through the caller's share of the API lane.
    expect(lanes.filter((c) => c.startsWith("tok:")).length).toBeGreaterThanOrEqual(1);
    // EVENT_FIELDS cost 15 an event: 305 events are 4,575, four points more than the subscription's own one.
    const { answered } = await answeredBeforeRefusal(h.url, replayer);
    expect(answered).toBeLessThanOrEqual(30 - 1 - Math.floor((total * 15) / 1000));
  });

  it("refuses a subscription over the cost budget with INVALID_INPUT naming the limit", async () => {
    const small = await startHarness({ LIMIT_COST: "60" });
    try {
      const t = await small.tenant();
      const open = small.app.liveOperations();
      const blocks = ["a", "b", "c", "d", "e"].map(
        (k) => `${k}: instance { id state desiredState flavor vcpus memoryMib diskGib imageId nodeId poolId version }`,
      );
      const w = watcher(small.url, t.token, `subscription { instanceEvents { cursor ${blocks.join(" ")} } }`, {});
      await settled(small, w, open);
      expect(errorOf(w)?.extensions).toMatchObject({ code: "INVALID_INPUT", limit: "cost" });
      await w.dispose();
    } finally {
      await small.close();
    }
  });
});

describe("a replay larger than the budget", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ LIMIT_RATE_POINTS: "12", LIMIT_RATE_WINDOW_S: "1" });
  });
  afterAll(() => h?.close());

  it("is paced over the windows it needs, never cut short", async () => {
    const t = await h.tenant();
    const pool = await h.hostedPool();
    const { createInstance } = await t.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } });
    const cycles = Array.from({ length: 60 }, () => ["stopped", "starting", "running"]).flat();
    await walk(h.platform, createInstance.id, ["starting", "running", ...cycles]);
    const total = 3 + 2 + cycles.length;
    const fat = `subscription($after: String) { instanceEvents(after: $after) { ${EVENT_FIELDS} i2: instance { id state desiredState flavor vcpus memoryMib diskGib imageId sshKeys addresses nodeId poolId version createdAt updatedAt } } }`;
    // 36 an event: 185 events cost 6,660, more than the 12 points a window holds.
    const w = watcher(h.url, t.token, fat, { after: "0" });
    await until("the whole history replayed", () => w.events.length >= total || w.errors.length > 0, 30_000);
    expect(w.errors).toEqual([]);
    expect(w.events.map((e) => (e as { version: number }).version)).toEqual(Array.from({ length: total }, (_, i) => i + 1));
    await w.dispose();
  });
});

describe("what a caller may hold open on a server", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ LIMIT_SUBSCRIPTIONS_PER_CONNECTION: "3", LIMIT_SUBSCRIPTIONS_PER_CALLER: "5", LIMIT_CONNECTIONS_PER_CALLER: "3" });
  });
  afterAll(() => h?.close());

  /** One graphql-ws connection holding several subscriptions; each subscription's outcome as it happens. */
  function connection(token: string) {
    const closed: { code: number }[] = [];
    const client = createGraphqlWs({
      url: h.url.replace(/^http/, "ws"),
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${token}` },
      retryAttempts: 0,
      // Connected at once and kept open with no subscription: the cap on connections counts sockets, not streams.
      lazy: false,
      onNonLazyError: () => {},
      on: { closed: (e) => void closed.push(e as { code: number }) },
    });
    const subscribe = () => {
      const s = { errors: [] as { extensions?: { code?: string; limit?: string } }[], stop: () => {} };
      s.stop = client.subscribe(
        { query: EVENTS, variables: {} },
        {
          next: (r) => void s.errors.push(...((r.errors ?? []) as never[])),
          error: (e) => void s.errors.push(...((Array.isArray(e) ? e : [e]) as never[])),
          complete: () => {},
        },
      );
      return s;
    };
    return { client, closed, subscribe };
  }

  it("caps operations per connection and per credential, frees a slot when one ends, and caps connections", async () => {
    const t = await h.tenant();
    const other = await h.tenant();
    const a = connection(t.token);
    const open = h.app.liveOperations();
    const onA = [a.subscribe(), a.subscribe(), a.subscribe()];
    await until("three subscriptions open", () => h.app.liveOperations() === open + 3);
    const fourth = a.subscribe();
    await until("the fourth refused", () => fourth.errors.length > 0);
    expect(fourth.errors[0]?.extensions).toMatchObject({ code: "RATE_LIMITED", limit: "subscriptionsPerConnection" });

    const b = connection(t.token);
    b.subscribe();
    b.subscribe();
    await until("five subscriptions open", () => h.app.liveOperations() === open + 5);
    const sixth = b.subscribe();
    await until("the sixth refused", () => sixth.errors.length > 0);
    expect(sixth.errors[0]?.extensions).toMatchObject({ code: "RATE_LIMITED", limit: "subscriptionsPerCaller" });

    // Another tenant's subscriptions are its own.
    const c = connection(other.token);
    const theirs = c.subscribe();
    await until("the other tenant's subscription open", () => h.app.liveOperations() === open + 6);
    expect(theirs.errors).toEqual([]);

    onA[0]?.stop();
    await until("one closed", () => h.app.liveOperations() === open + 5);
    const again = b.subscribe();
    await until("a new one open in the freed slot", () => h.app.liveOperations() === open + 6);
    expect(again.errors).toEqual([]);

    const c2 = connection(t.token);
    const mine = () => [...h.app.hub.connections].filter((x) => x.principal?.tenantId === t.id).length;
    await until("a third connection admitted", () => mine() === 3);
    const d = connection(t.token);
    await until("a fourth connection closed", () => d.closed.length > 0);
    expect(d.closed[0]?.code).toBe(4429);
    for (const x of [a, b, c, c2, d]) await x.client.dispose();
  });
});

describe("what a websocket may send", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ LIMIT_BODY_BYTES: "65536" });
  });
  afterAll(() => h?.close());

  /** A raw graphql-transport-ws socket: what it was sent back, and how it closed. */
  function raw() {
    const ws = new WebSocket(h.url.replace(/^http/, "ws"), "graphql-transport-ws");
    const got: { type: string }[] = [];
    const closed = new Promise<number>((resolve) => ws.on("close", (code) => resolve(code)));
    ws.on("message", (m) => got.push(JSON.parse(String(m))));
    ws.on("error", () => {});
    return { ws, got, closed, opened: new Promise((r) => ws.once("open", r)) };
  }

  it("ends a socket whose connection_init is large (under the frame limit, over limits.wsPreAuthBytes) before it is acknowledged", async () => {
    const t = await h.tenant();
    const s = raw();
    await s.opened;
    s.ws.send(JSON.stringify({ type: "connection_init", payload: { authorization: `Bearer ${t.token}`, pad: "x".repeat(40 * 1024) } }));
    await s.closed;
    expect(s.got.map((m) => m.type)).not.toContain("connection_ack");
  });

  it("refuses a frame over the HTTP body limit once authenticated (1009)", async () => {
    const t = await h.tenant();
    const s = raw();
    await s.opened;
    s.ws.send(JSON.stringify({ type: "connection_init", payload: { authorization: `Bearer ${t.token}` } }));
    await until("acknowledged", () => s.got.some((m) => m.type === "connection_ack"));
    s.ws.send(JSON.stringify({ id: "1", type: "subscribe", payload: { query: `{ viewer { identityId } }`, pad: "y".repeat(70_000) } }));
    expect(await s.closed).toBe(1009);
  });
});

describe("unknown tokens", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ LIMIT_AUTH_FAILURES: "5", LIMIT_RATE_WINDOW_S: "600" });
  });
  afterAll(() => h?.close());

  it("are refused unread per source address past limits.authFailures; credentials the server knows keep working", async () => {
    const known = await h.tenant();
    const unused = await h.tenant();
    expect(codeOf(await post(h.url, VIEWER, known.token))).toBe("ANSWERED");
    for (let i = 0; i < 5; i++) expect(codeOf(await post(h.url, VIEWER, `bct_made_up_${i}`))).toBe("UNAUTHENTICATED");
    const refused = await post(h.url, VIEWER, "bct_made_up_6");
    expect(codeOf(refused)).toBe("RATE_LIMITED");
    expect(refused.status).toBe(429);
    expect(refused.errors?.[0]?.extensions?.limit).toBe("authFailures");
    // What this server already proved is not read again, and the operator's token needs no read.
    expect(codeOf(await post(h.url, VIEWER, known.token))).toBe("ANSWERED");
    expect(codeOf(await post(h.url, VIEWER, h.operatorToken))).toBe("ANSWERED");
    expect(codeOf(await post(h.url, VIEWER, unused.token))).toBe("RATE_LIMITED");
    // A websocket from that address with an unknown token: told to come back later, not that its token is bad.
    const w = watcher(h.url, "bct_made_up_7", EVENTS, {});
    await until("closed", () => w.closed !== null);
    expect(w.closed?.code).toBe(1013);
    await w.dispose();
  });
});
