import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CreateApiTokenDocument,
  CreateInstanceDocument,
  CreateTenantDocument,
  DeleteInstanceDocument,
  type InstanceEventFieldsFragment,
  StartInstanceDocument,
  StopInstanceDocument,
  watchInstanceEvents,
} from "../../sdk/client.ts";
import { waitForState } from "../support/hosts.ts";
import { headCursor } from "../support/live.ts";
import { type Cluster, startCluster } from "./processes.ts";

let c: Cluster;
beforeAll(async () => {
  c = await startCluster({ hosts: 1 });
});
afterAll(async () => {
  const errors = c?.errors() ?? [];
  if (errors.length) console.error(`process errors:\n${errors.slice(0, 20).join("\n")}`);
  await c?.close();
});

async function tenant(name: string) {
  const { createTenant } = await c.operator.request(CreateTenantDocument, { input: { name } });
  const { createApiToken } = await c.operator.request(CreateApiTokenDocument, { input: { tenantId: createTenant.id, name } });
  return { token: createApiToken.token, identityId: createApiToken.apiToken.identityId, client: c.client(createApiToken.token) };
}

/** Read a resuming watch into an array until the caller stops it. */
function collect(opts: Parameters<typeof watchInstanceEvents>[0]) {
  const stop = new AbortController();
  const seen: InstanceEventFieldsFragment[] = [];
  const done = (async () => {
    for await (const e of watchInstanceEvents({ ...opts, signal: stop.signal })) seen.push(e);
  })();
  return {
    seen,
    stop: async () => {
      stop.abort();
      await done;
    },
  };
}

describe("two server replicas, a worker and an agent on one PostgreSQL and one Redis", () => {
  it("a subscriber on one replica sees every change made through the other and by the worker, across its own restart", async () => {
    const replica = await c.addServer();
    const a = await tenant("alpha");
    const b = await tenant("beta");
    const after = await headCursor(a.client);
    const reconnects: (number | null)[] = [];
    const watchA = collect({ url: replica.url, token: a.token, after, onReconnect: (w) => reconnects.push(w.code) });
    const watchB = collect({ url: replica.url, token: b.token, after });

    // Everything is asked of the first server; the worker and the agent do the rest.
    const inst = (await a.client.request(CreateInstanceDocument, { input: { poolId: c.poolId, flavor: "tiny", imageId: c.imageId } })).createInstance;
    await waitForState(a.client, inst.id, "RUNNING", 30_000);
    await expect.poll(() => watchA.seen.at(-1)?.toState, { timeout: 10_000, interval: 50 }).toBe("RUNNING");

    // The watched replica goes down hard while the instance keeps changing; the watcher resumes on its return.
    await replica.restart("SIGKILL");
    await a.client.request(StopInstanceDocument, { id: inst.id });
    await waitForState(a.client, inst.id, "STOPPED", 30_000);
    await a.client.request(StartInstanceDocument, { id: inst.id });
    await waitForState(a.client, inst.id, "RUNNING", 30_000);
    await a.client.request(DeleteInstanceDocument, { id: inst.id });
    await waitForState(a.client, inst.id, "DELETED", 30_000);
    await expect.poll(() => watchA.seen.at(-1)?.toState, { timeout: 20_000, interval: 50 }).toBe("DELETED");
    expect(reconnects.length).toBeGreaterThan(0);

    // Exactly the table's history of the instance: every version once, in order, with who and why.
    const rows = await c.inspect((p) =>
      p.db.prisma.instanceEvent.findMany({
        where: { instanceId: inst.id },
        orderBy: { version: "asc" },
        select: { version: true, toState: true, reason: true, actor: true },
      }),
    );
    expect(watchA.seen.map((e) => [e.version, e.toState.toLowerCase(), e.reason, e.actor])).toEqual(rows.map((r) => [r.version, r.toState, r.reason, r.actor]));
    expect(rows.map((r) => r.version)).toEqual(rows.map((_, i) => i + 1));
    const actors = new Set(rows.map((r) => r.actor));
    expect(actors.has(a.identityId)).toBe(true);
    expect(actors.size).toBeGreaterThan(1);
    expect(watchB.seen).toEqual([]);
    await watchA.stop();
    await watchB.stop();
  });
});
