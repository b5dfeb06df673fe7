import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateInstanceDocument, InstanceDocument, StartInstanceDocument, StopInstanceDocument } from "../../sdk/client.ts";
import { until } from "../support/fixtures.ts";
import { type Hosts, startHosts } from "../support/hosts.ts";

/**
 * Convergence without empty steps, with no worker running at all: a create is scheduled and placed in its own
 * write, its host hears of it at commit, and the passes its reports prove are taken by the server where the
 * reports arrive. (The jobs those writes enqueue wait in the queue, unrun: nothing here depends on them.)
 */
let hosts: Hosts;
beforeAll(async () => {
  hosts = await startHosts(1, {}, { worker: false });
});
afterAll(() => hosts?.close());

describe("convergence without a worker", () => {
  it("runs a create, and stops and starts it, on the host's reports alone, each step an event in order", async () => {
    const t = await hosts.h.tenant();
    const { createInstance: inst } = await t.client.request(CreateInstanceDocument, {
      input: { poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId },
    });
    expect(inst).toMatchObject({ state: "PROVISIONING", version: 3 });
    const state = async () => (await t.client.request(InstanceDocument, { id: inst.id })).instance?.state;
    await until("running without a worker", async () => (await state()) === "RUNNING", 10_000);
    await t.client.request(StopInstanceDocument, { id: inst.id });
    await until("stopped", async () => (await state()) === "STOPPED", 10_000);
    await t.client.request(StartInstanceDocument, { id: inst.id });
    await until("running again", async () => (await state()) === "RUNNING", 10_000);
    const events = await hosts.h.platform.read((sql) =>
      sql.query<{ v: number; to: string; reason: string }>(
        `SELECT version AS v, to_state AS to, reason FROM instance_events WHERE instance_id = $1 ORDER BY position`,
        [inst.id],
      ),
    );
    expect(events.map((e) => e.v)).toEqual(events.map((_, i) => i + 1));
    expect(events.map((e) => `${e.to} ${e.reason}`)).toEqual([
      "pending created",
      "scheduling schedule",
      "provisioning placed",
      "starting host:defined",
      "running host:running",
      "running requested:stopped",
      "stopped host:stopped",
      "stopped requested:running",
      "starting start",
      "running host:running",
    ]);
  });
});
