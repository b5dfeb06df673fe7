import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Instance } from "../../core/instances/model.ts";
import { INSTANCE_COLUMNS } from "../../core/instances/model.ts";
import { createRequest } from "../../core/pools/provider/sync.ts";
import type { ProviderEmulator } from "../../providers/emulator.ts";
import {
  DeleteInstanceDocument,
  InstanceEventsCursorDocument,
  ProviderAccountDocument,
  ProviderOffersDocument,
  ResizeInstanceDocument,
  StartInstanceDocument,
  StopInstanceDocument,
} from "../../sdk/client.ts";
import { watchInstanceEvents } from "../../sdk/watch.ts";
import { startWorker } from "../../worker/index.ts";
import { until } from "../support/fixtures.ts";
import { expectCode, type Harness, startHarness } from "../support/harness.ts";
import { invariantViolations } from "../support/ledger.ts";
import { createProviderInstance, emulators, instanceOf, type ProviderPool, providerEnv, providerPool } from "../support/providers.ts";

/**
 * The provider conformance suite: the same cases against every provider plugin, each through its emulator (a
 * real HTTP server), the real worker on BullMQ and Redis, and the API. A plugin that passes these behaves as
 * the reconciler needs: create is exactly once (adopting after a crash), every call is idempotent, failures are
 * classified, the rate limit is honoured, machines nobody owns are removed.
 */
describe.each(Object.keys(emulators))("provider %s", (provider) => {
  let h: Harness;
  let emu: ProviderEmulator;
  let worker: { close(): Promise<void> } | null;
  let pool: ProviderPool;
  let t: Awaited<ReturnType<Harness["tenant"]>>;

  const state = async (id: string) => (await instanceOf(t.client, id)).state;
  const waitFor = (id: string, want: string, timeout = 20_000) => expect.poll(() => state(id), { timeout, interval: 25 }).toBe(want);
  const machineOf = (externalId: string | null | undefined) => emu.machines().find((m) => m.externalId === externalId);

  beforeAll(async () => {
    emu = await (emulators[provider] as (o: { actionMs: number }) => Promise<ProviderEmulator>)({ actionMs: 40 });
    h = await startHarness(providerEnv);
    worker = await startWorker(h.platform);
    pool = await providerPool(h, emu, [
      { name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 },
      { name: "huge", vcpus: 256, memoryMib: 1_048_576, diskGib: 60_000 },
    ]);
    t = await h.tenant();
  });
  afterAll(async () => {
    await worker?.close();
    await h?.close();
    await emu?.close();
  });

  it("maps each flavor to the smallest offer that holds it, and refuses what none holds", async () => {
    const { providerOffers } = await t.client.request(ProviderOffersDocument, { poolId: pool.poolId });
    const small = providerOffers.find((o) => o.flavors.includes("small"));
    expect(small).toBeDefined();
    const fitting = providerOffers.filter((o) => o.vcpus >= 1 && o.memoryMib >= 1024 && o.diskGib >= 10);
    expect(fitting.every((o) => o.vcpus > (small?.vcpus ?? 0) || o.memoryMib >= (small?.memoryMib ?? 0))).toBe(true);
    expect(providerOffers.some((o) => o.flavors.includes("huge"))).toBe(false);
    await expectCode(createProviderInstance(t.client, pool, { flavor: "huge" }), "UNSCHEDULABLE");
  });

  it("creates a machine and runs it; the instance takes its id, addresses and offer from the provider", async () => {
    const inst = await createProviderInstance(t.client, pool);
    expect(inst.nodeId).toBeNull();
    expect(inst.addresses).toEqual([]);
    await waitFor(inst.id, "RUNNING");
    const running = await instanceOf(t.client, inst.id);
    expect(running.externalId).toBeTruthy();
    expect(running.addresses.length).toBeGreaterThan(0);
    expect(running.offer).toBeTruthy();
    expect(machineOf(running.externalId)?.instanceId).toBe(inst.id);
    await expectCode(t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "small" }), "UNSUPPORTED");
  });

  it("runs an instance created through the SDK, and its events arrive on the subscription", async () => {
    const after = (await t.client.request(InstanceEventsCursorDocument)).instanceEventsCursor;
    const stop = new AbortController();
    const seen: string[] = [];
    const watch = (async () => {
      for await (const e of watchInstanceEvents({ url: h.url, token: t.token, after, poolId: pool.poolId, signal: stop.signal })) {
        seen.push(e.toState);
        if (e.toState === "RUNNING") return;
      }
    })();
    const inst = await createProviderInstance(t.client, pool);
    await watch;
    stop.abort();
    expect(seen).toEqual(["PENDING", "SCHEDULING", "PROVISIONING", "STARTING", "RUNNING"]);
    expect(await state(inst.id)).toBe("RUNNING");
  });

  it("creates exactly once for a replayed create", async () => {
    const [a, b] = await Promise.all([
      createProviderInstance(t.client, pool, { idempotencyKey: `${provider}-same` }),
      createProviderInstance(t.client, pool, { idempotencyKey: `${provider}-same` }),
    ]);
    expect(a.id).toBe(b.id);
    await waitFor(a.id, "RUNNING");
    expect(emu.createdPerInstance().get(a.id)).toBe(1);
  });

  it("stops and starts the machine", async () => {
    const inst = await createProviderInstance(t.client, pool);
    await waitFor(inst.id, "RUNNING");
    await t.client.request(StopInstanceDocument, { id: inst.id });
    await waitFor(inst.id, "STOPPED");
    const externalId = (await instanceOf(t.client, inst.id)).externalId;
    expect(["off", "stopped"]).toContain(machineOf(externalId)?.status);
    await t.client.request(StartInstanceDocument, { id: inst.id });
    await waitFor(inst.id, "RUNNING");
    expect(machineOf(externalId)?.status).toBe("running");
  });

  it("creates a machine powered off when asked for a stopped instance", async () => {
    const inst = await createProviderInstance(t.client, pool, { desiredState: "STOPPED" });
    await waitFor(inst.id, "STOPPED");
    expect(["off", "stopped"]).toContain(machineOf((await instanceOf(t.client, inst.id)).externalId)?.status);
  });

  it("deletes twice, and the provider has no machine after", async () => {
    const inst = await createProviderInstance(t.client, pool);
    await waitFor(inst.id, "RUNNING");
    const externalId = (await instanceOf(t.client, inst.id)).externalId as string;
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await waitFor(inst.id, "DELETED");
    expect(machineOf(externalId)).toBeUndefined();
    const session = await h.platform.sync.providers.session(pool.accountId);
    expect(await session.get(externalId)).toBeNull();
    await session.delete(externalId); // deleting what is gone is done
  });

  it("marks an instance lost when its machine disappears, and restarts one powered off behind its back", async () => {
    const a = await createProviderInstance(t.client, pool);
    const b = await createProviderInstance(t.client, pool);
    await waitFor(a.id, "RUNNING");
    await waitFor(b.id, "RUNNING");
    emu.destroyBehindBack((await instanceOf(t.client, a.id)).externalId as string);
    emu.powerOffBehindBack((await instanceOf(t.client, b.id)).externalId as string);
    await waitFor(a.id, "LOST");
    expect((await instanceOf(t.client, a.id)).conditions.map((c) => c.reason)).toContain("MachineGone");
    await waitFor(b.id, "RUNNING");
    await t.client.request(DeleteInstanceDocument, { id: a.id });
    await waitFor(a.id, "DELETED");
  });

  it("takes a recorded id the provider gave to another machine as its machine gone, and deletes nothing of the other's", async () => {
    const a = await createProviderInstance(t.client, pool);
    await waitFor(a.id, "RUNNING");
    const externalId = (await instanceOf(t.client, a.id)).externalId as string;
    // Ours destroyed behind our back and its id reused at once, for a machine of another deployment.
    const other = "inst_cccccccccccccccccccccccccccccccccccccccccccccccccccc";
    expect(await emu.plant(other, "someone-else", externalId)).toBe(externalId);
    await waitFor(a.id, "LOST");
    await t.client.request(DeleteInstanceDocument, { id: a.id });
    await waitFor(a.id, "DELETED");
    expect(machineOf(externalId)?.instanceId).toBe(other);
    emu.destroyBehindBack(externalId);
  });

  it("classifies failures: only transient ones are retried, the others wait in error for a start", async () => {
    emu.failNext("create", "transient", 2);
    const retried = await createProviderInstance(t.client, pool);
    await waitFor(retried.id, "RUNNING");
    expect((await instanceOf(t.client, retried.id)).conditions).toEqual([]);

    for (const kind of ["capacity", "quota", "auth", "invalid"] as const) {
      emu.failNext("create", kind, 1);
      const inst = await createProviderInstance(t.client, pool);
      await waitFor(inst.id, "ERROR");
      const failed = await instanceOf(t.client, inst.id);
      expect(failed.conditions).toEqual([expect.objectContaining({ type: "ProviderError", reason: kind })]);
      expect(emu.createdPerInstance().get(inst.id) ?? 0).toBe(0);
      const before = emu.requests();
      // Resting in error: a sweep or two pass without a call for it.
      await until("two provider sweeps", () => emu.requests() > before + 4, 10_000);
      expect(await state(inst.id)).toBe("ERROR");
      expect(emu.createdPerInstance().get(inst.id) ?? 0).toBe(0);
      await t.client.request(StartInstanceDocument, { id: inst.id });
      await waitFor(inst.id, "RUNNING");
      expect((await instanceOf(t.client, inst.id)).conditions).toEqual([]);
    }
  });

  it("adopts the machine a worker made before it died, instead of making a second", async () => {
    await worker?.close();
    worker = null;
    const inst = await createProviderInstance(t.client, pool);
    // What the dead worker did: the provider call, and no database write after it.
    const [row] = await h.platform.read((sql) => sql.query<Instance>(`SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = $1`, [inst.id]));
    const session = await h.platform.sync.providers.session(pool.accountId);
    await session.create(await createRequest(h.platform.sync, row as Instance));
    expect(emu.createdPerInstance().get(inst.id)).toBe(1);
    worker = await startWorker(h.platform);
    await waitFor(inst.id, "RUNNING");
    expect(emu.createdPerInstance().get(inst.id)).toBe(1);
    expect(emu.machines().filter((m) => m.instanceId === inst.id)).toHaveLength(1);
  });

  it("removes machines labelled as ours that no instance owns, after the grace, and leaves others' alone", async () => {
    const managedBy = h.platform.sync.providers.managedBy;
    const orphan = await emu.plant("inst_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", managedBy);
    const foreign = await emu.plant("inst_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "someone-else");
    await until("the orphan to be reported", async () => {
      const { providerAccount } = await h.operator.request(ProviderAccountDocument, { id: pool.accountId });
      return providerAccount?.orphans.some((o) => o.externalId === orphan) ?? false;
    });
    await until("the orphan to be removed", () => !emu.machines().some((m) => m.externalId === orphan), 15_000);
    expect(emu.machines().some((m) => m.externalId === foreign)).toBe(true);
  });

  it("honours the provider's rate limit", async () => {
    // A budget the sweeps (every 300 ms here) leave room in, but that three creates and their polls exhaust.
    emu.rateLimit(30, 1000);
    const before = emu.rateLimited();
    const made = await Promise.all([0, 1, 2].map(() => createProviderInstance(t.client, pool)));
    for (const i of made) await waitFor(i.id, "RUNNING", 40_000);
    // Once told to wait, the client sends nothing until the window reopens: a handful of refusals at most.
    expect(emu.rateLimited() - before).toBeLessThanOrEqual(6);
    emu.rateLimit(1_000_000, 1000);
  });

  it("waits out a spent rate limit without rewriting its instances", async () => {
    // Ten requests a second (the sweeps take three) for four creates: many looks are refused by the client itself, each with another
    // "wait N ms". The instance notes the rate limit once and keeps its backoff; it is not written (an event, a
    // new version, a wake-up) for every refusal.
    emu.rateLimit(10, 1000);
    const made = await Promise.all(Array.from({ length: 4 }, () => createProviderInstance(t.client, pool)));
    // What this asserts is the versions below, not how soon: the four share ten requests a second with the
    // sweeps (4 s for Hetzner Cloud's client, which hands out refills in turn, 12 s for Proxmox's, here).
    for (const i of made) await waitFor(i.id, "RUNNING", 90_000);
    emu.rateLimit(1_000_000, 1000);
    // A look refused while running left a note; the next look that gets through takes it off.
    for (const i of made) await until(`${i.id}'s rate-limit note to clear`, async () => (await instanceOf(t.client, i.id)).conditions.length === 0, 30_000);
    const history = await h.platform.read((sql) =>
      sql.query<{ id: string; version: number; line: string; addresses: number }>(
        `SELECT i.id, i.version, string_agg(e.version || ' ' || e.to_state || ' ' || e.reason, ', ' ORDER BY e.version) AS line,
                count(*) FILTER (WHERE e.reason = 'provider:addresses')::int AS addresses
           FROM instances i JOIN instance_events e ON e.instance_id = i.id WHERE i.id = ANY($1::text[]) GROUP BY i.id, i.version`,
        [made.map((i) => i.id)],
      ),
    );
    expect(history).toHaveLength(made.length);
    for (const v of history) {
      // Created pending, then scheduling → provisioning → starting → running, a note in each of the five states
      // and the last one's clearing: at most 11.
      expect(v.version, `${v.id}: ${v.line}`).toBeLessThanOrEqual(11);
      // A refused look says nothing of the addresses: they are not swapped back and forth with the refusals.
      expect(v.addresses, `${v.id}: ${v.line}`).toBeLessThanOrEqual(1);
    }
  }, 120_000);

  it("leaves quota, events and instances balanced, and no machine for a deleted instance", async () => {
    const live = await h.platform.read((sql) => sql.query<{ id: string }>(`SELECT id FROM instances WHERE state <> 'deleted'`));
    for (const { id } of live) await t.client.request(DeleteInstanceDocument, { id });
    for (const { id } of live) await waitFor(id, "DELETED");
    expect(await invariantViolations(h.platform)).toEqual([]);
    expect(emu.machines().filter((m) => m.managedBy === h.platform.sync.providers.managedBy)).toEqual([]);
    const usage = await h.platform.read((sql) => sql.query(`SELECT 1 FROM quota_usage WHERE used <> 0`));
    expect(usage).toEqual([]);
  });
});
