import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openDatabase } from "../../infra/db/index.ts";
import { openPlatform } from "../../infra/platform.ts";
import {
  CreateApiTokenDocument,
  CreateInstanceDocument,
  CreatePoolDocument,
  CreateProjectDocument,
  CreateTenantDocument,
  createClient,
  DeleteInstanceDocument,
  ImagesDocument,
  InstanceDocument,
  InstancesDocument,
  type InstancesQuery,
  NodesDocument,
  PoolWithNodesDocument,
  ProjectsDocument,
  RegisterImageDocument,
  RevokeApiTokenDocument,
  StopInstanceDocument,
  TenantsDocument,
  ViewerDocument,
} from "../../sdk/client.ts";
import { startServer } from "../../server/app.ts";
import { PrincipalCache } from "../../server/principal-cache.ts";
import { sha256Of, until } from "../support/fixtures.ts";
import { expectCode, type Harness, startHarness } from "../support/harness.ts";

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(() => h?.close());

describe("authentication", () => {
  it("knows who is calling", async () => {
    expect((await h.operator.request(ViewerDocument)).viewer).toMatchObject({ isOperator: true, tenantId: null });
    const t = await h.tenant({ scopes: ["compute:instances:read"] });
    expect((await t.client.request(ViewerDocument)).viewer).toMatchObject({
      isOperator: false,
      tenantId: t.id,
      identityId: t.identityId,
      scopes: ["compute:instances:read"],
    });
  });

  it("refuses an expiry it could not read back, before writing anything", async () => {
    const t = await h.tenant();
    const tokens = () => h.platform.db.prisma.apiToken.count();
    const before = await tokens();
    for (const expiresAt of ["+099999-01-01T00:00:00Z", "-000001-01-01T00:00:00Z", "10000-01-01T00:00:00Z", "2030-01-01"]) {
      await expectCode(h.operator.request(CreateApiTokenDocument, { input: { tenantId: t.id, name: "far", expiresAt } }), "INVALID_INPUT");
    }
    expect(await tokens()).toBe(before);
    const { createApiToken } = await h.operator.request(CreateApiTokenDocument, { input: { tenantId: t.id, name: "last", expiresAt: "9999-12-31T23:59:59Z" } });
    expect(createApiToken.apiToken.expiresAt).toBe("9999-12-31T23:59:59.000Z");
  });

  it("refuses a missing, unknown, revoked or expired token with UNAUTHENTICATED", async () => {
    await expectCode(h.client().request(ViewerDocument), "UNAUTHENTICATED");
    await expectCode(h.client("bct_made_up").request(ViewerDocument), "UNAUTHENTICATED");
    const t = await h.tenant();
    const { createApiToken } = await h.operator.request(CreateApiTokenDocument, { input: { tenantId: t.id, name: "short" } });
    await h.operator.request(RevokeApiTokenDocument, { id: createApiToken.apiToken.id });
    await expectCode(h.client(createApiToken.token).request(ViewerDocument), "UNAUTHENTICATED");
    const soon = new Date(Date.now() + 1500).toISOString();
    const { createApiToken: expiring } = await h.operator.request(CreateApiTokenDocument, { input: { tenantId: t.id, name: "expiring", expiresAt: soon } });
    expect((await h.client(expiring.token).request(ViewerDocument)).viewer.tenantId).toBe(t.id);
    // Wait for the expiry instant itself (bounded), not a fixed sleep.
    await expect
      .poll(
        () =>
          h
            .client(expiring.token)
            .request(ViewerDocument)
            .then(
              () => "ok",
              (e) => e.code,
            ),
        { timeout: 5000, interval: 100 },
      )
      .toBe("UNAUTHENTICATED");
  });

  it("forgets a token it remembered once it is revoked, on this server at once and on another through pub/sub", async () => {
    const t = await h.tenant();
    const { createApiToken } = await h.operator.request(CreateApiTokenDocument, { input: { tenantId: t.id, name: "remembered" } });
    // Another server with a platform of its own: it hears the revocation through Redis only.
    const db = await openDatabase({ databaseUrl: h.dbUrl, poolSize: 2 });
    const other = await openPlatform(h.platform.config, { db });
    const replica = await startServer(other, { port: 0, host: "127.0.0.1" });
    try {
      const here = h.client(createApiToken.token);
      const there = createClient({ url: replica.url, token: createApiToken.token });
      // Twice on each: the second answer comes from what the server remembered.
      for (const c of [here, there, here, there]) expect((await c.request(ViewerDocument)).viewer.tenantId).toBe(t.id);
      await h.operator.request(RevokeApiTokenDocument, { id: createApiToken.apiToken.id });
      await expectCode(here.request(ViewerDocument), "UNAUTHENTICATED");
      // Far sooner than the 10 s a remembered principal would otherwise last.
      await until(
        "the replica refusing the revoked token",
        () =>
          there.request(ViewerDocument).then(
            () => false,
            (e) => e.code === "UNAUTHENTICATED",
          ),
        2000,
      );
    } finally {
      await replica.close();
      await other.close();
    }
  });

  it("remembers only what no revocation overtook, and never past an expiry", async () => {
    const cache = PrincipalCache.open(h.platform, 60_000);
    try {
      const principal = (expiresAt: Date | null) => ({
        identityId: "idn_x",
        tenantId: "ten_x",
        operator: false,
        scopes: new Set<never>(),
        credential: { key: "tok:x", expiresAt },
      });
      let reads = 0;
      const read = (p: ReturnType<typeof principal>) => async () => {
        reads++;
        return p;
      };
      const now = new Date();
      await cache.principal("bearer-1", now, read(principal(null)));
      await cache.principal("bearer-1", now, read(principal(null)));
      expect(reads).toBe(1);
      // A lookup that read the row before a revocation committed must not be kept.
      let release: () => void = () => {};
      const slow = cache.principal("bearer-2", now, async () => {
        reads++;
        await new Promise<void>((r) => {
          release = r;
        });
        return principal(null);
      });
      await until("the slow lookup started", () => reads === 2);
      cache.revoke("tok:other");
      release();
      await slow;
      await cache.principal("bearer-2", now, read(principal(null)));
      expect(reads).toBe(3);
      // Expired since it was remembered: read again (which says null for an expired token).
      await cache.principal("bearer-3", now, read(principal(new Date(now.getTime() + 1000))));
      expect(
        await cache.principal("bearer-3", new Date(now.getTime() + 1000), async () => {
          reads++;
          return null;
        }),
      ).toBeNull();
      expect(reads).toBe(5);
    } finally {
      await cache.close();
    }
  });

  it("reads a credential again behind a request once past half its time, and forgets one the read no longer finds", async () => {
    const ttl = 1000;
    const cache = PrincipalCache.open(h.platform, ttl);
    try {
      const who = { identityId: "idn_y", tenantId: "ten_y", operator: false, scopes: new Set<never>(), credential: { key: "tok:y", expiresAt: null } };
      const now = new Date();
      // A request whose lookup never answers gets its answer from memory, or not at all.
      const fromMemory = (bearer: string, lookup: () => Promise<typeof who | null>) =>
        Promise.race([cache.principal(bearer, now, lookup), new Promise((r) => setTimeout(() => r("waited on a read"), 2000))]);
      let reads = 0;
      let release: () => void = () => {};
      const held = async () => {
        reads++;
        await new Promise<void>((r) => (release = r));
        return who;
      };
      const rememberedAt = Date.now();
      const first = async () => {
        reads++;
        return who;
      };
      expect(await cache.principal("bearer-a", now, first)).toBe(who);
      // Asked again until past half its time: each answer from memory, and one read starts behind them.
      await until(
        "a read behind the requests",
        async () => {
          expect(await fromMemory("bearer-a", held)).toBe(who);
          return reads === 2;
        },
        5000,
      );
      expect(await fromMemory("bearer-a", held)).toBe(who);
      expect(reads).toBe(2);
      release();
      // Renewed by that read: still remembered once the first ttl has passed.
      await until("the first ttl to pass", () => Date.now() - rememberedAt > ttl, 5000);
      expect(await fromMemory("bearer-a", () => new Promise<never>(() => {}))).toBe(who);

      // Gone from the database, its revocation message missed: the read behind a request forgets it, and the
      // request after that reads it itself (null: refused). Without that read it would be read once, at expiry.
      let gone = 0;
      const none = async () => {
        gone++;
        return null;
      };
      expect(await cache.principal("bearer-b", now, async () => who)).toBe(who);
      await until("the credential to be forgotten", async () => (await cache.principal("bearer-b", now, none)) === null, 5000);
      expect(gone).toBe(2);
    } finally {
      await cache.close();
    }
  });

  it("stores only a hash of each token", async () => {
    const t = await h.tenant();
    const row = await h.platform.db.prisma.apiToken.findFirstOrThrow({ where: { identity: { tenantId: t.id } } });
    expect(row.tokenHash).toMatch(/^[0-9a-f]{64}$/);
    expect(JSON.stringify(row)).not.toContain(t.token);
  });

  it("keeps operator actions for operators: FORBIDDEN for tenants", async () => {
    const t = await h.tenant();
    await expectCode(t.client.request(CreateTenantDocument, { input: { name: "evil" } }), "FORBIDDEN");
    await expectCode(t.client.request(CreateApiTokenDocument, { input: { tenantId: t.id, name: "more" } }), "FORBIDDEN");
    await expectCode(t.client.request(CreatePoolDocument, { input: { name: "mine", class: "VPS_HOST", ipv4Range: "10.0.0.0/24" } }), "FORBIDDEN");
    await expectCode(t.client.request(TenantsDocument), "FORBIDDEN");
    const pool = await h.hostedPool();
    await expectCode(t.client.request(NodesDocument, { poolId: pool.poolId }), "FORBIDDEN");
    await expectCode(t.client.request(PoolWithNodesDocument, { id: pool.poolId }), "FORBIDDEN");
    await expectCode(
      t.client.request(RegisterImageDocument, {
        input: { name: "pub", source: "https://x.invalid/a.raw", sha256: sha256Of("c"), format: "RAW", public: true },
      }),
      "FORBIDDEN",
    );
  });

  it("refuses unknown scopes when minting a token", async () => {
    const t = await h.tenant();
    await expectCode(h.operator.request(CreateApiTokenDocument, { input: { tenantId: t.id, name: "x", scopes: ["compute:everything"] } }), "INVALID_INPUT");
    await expectCode(h.operator.request(CreateApiTokenDocument, { input: { tenantId: "ten_nope", name: "x" } }), "NOT_FOUND");
  });
});

describe("tenant isolation", () => {
  it("shows another tenant's objects as absent, never as forbidden", async () => {
    const [a, b] = [await h.tenant(), await h.tenant()];
    const pool = await h.hostedPool();
    const inst = (
      await a.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, userData: "secret-a" } })
    ).createInstance;
    expect((await b.client.request(InstanceDocument, { id: inst.id })).instance).toBeNull();
    await expectCode(b.client.request(StopInstanceDocument, { id: inst.id }), "NOT_FOUND");
    await expectCode(b.client.request(DeleteInstanceDocument, { id: inst.id }), "NOT_FOUND");
    expect((await b.client.request(InstancesDocument, { owner: "TENANT" })).instances.edges).toEqual([]);
    await expectCode(b.client.request(InstancesDocument, { owner: "ALL" }), "INVALID_INPUT");
    const { registerImage } = await a.client.request(RegisterImageDocument, {
      input: { name: "a-only", source: "https://x.invalid/a.raw", sha256: sha256Of("d"), format: "RAW" },
    });
    expect((await b.client.request(ImagesDocument)).images.map((i) => i.id)).not.toContain(registerImage.id);
    expect((await a.client.request(ImagesDocument)).images.map((i) => i.id)).toContain(registerImage.id);
    await a.client.request(CreateProjectDocument, { name: "a-proj" });
    expect((await b.client.request(ProjectsDocument, {})).projects).toEqual([]);
  });

  it("returns user data in clear to its owner only", async () => {
    const a = await h.tenant();
    const pool = await h.hostedPool();
    const inst = (
      await a.client.request(CreateInstanceDocument, {
        input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, userData: "#cloud-config\nsecret: 1" },
      })
    ).createInstance;
    expect((await a.client.request(InstanceDocument, { id: inst.id })).instance?.userData).toBe("#cloud-config\nsecret: 1");
    // A colleague in the same tenant sees the instance but not the user data; neither does the operator.
    const { createApiToken } = await h.operator.request(CreateApiTokenDocument, { input: { tenantId: a.id, name: "colleague" } });
    const colleague = h.client(createApiToken.token);
    const seen = (await colleague.request(InstanceDocument, { id: inst.id })).instance;
    expect(seen?.id).toBe(inst.id);
    expect(seen?.userData).toBeNull();
    expect((await h.operator.request(InstanceDocument, { id: inst.id })).instance?.userData).toBeNull();
  });

  it("lists the caller's own by default, the tenant's on request, pages with a stable cursor", async () => {
    const a = await h.tenant();
    const pool = await h.hostedPool();
    const { createApiToken } = await h.operator.request(CreateApiTokenDocument, { input: { tenantId: a.id, name: "second" } });
    const second = h.client(createApiToken.token);
    const mine: string[] = [];
    for (let i = 0; i < 5; i++)
      mine.push(
        (await a.client.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, idempotencyKey: `m${i}` } }))
          .createInstance.id,
      );
    await second.request(CreateInstanceDocument, { input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId } });
    const seen: string[] = [];
    let after: string | null = null;
    for (let page = 0; page < 5; page++) {
      const res: InstancesQuery = await a.client.request(InstancesDocument, { first: 2, after });
      seen.push(...res.instances.edges.map((e) => e.node.id));
      after = res.instances.pageInfo.endCursor;
      if (!res.instances.pageInfo.hasNextPage) break;
    }
    expect(seen.sort()).toEqual([...mine].sort());
    expect((await a.client.request(InstancesDocument, { owner: "TENANT" })).instances.edges).toHaveLength(6);
    expect((await a.client.request(InstancesDocument, { poolId: pool.poolId, state: "RUNNING" })).instances.edges).toHaveLength(0);
    await expectCode(a.client.request(InstancesDocument, { after: "garbage" }), "INVALID_INPUT");
    await expectCode(a.client.request(InstancesDocument, { first: 0 }), "INVALID_INPUT");
  });
});
