import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CreateApiTokenDocument,
  CreateInstanceDocument,
  CreateTenantDocument,
  DeleteInstanceDocument,
  ResizeInstanceDocument,
  StartInstanceDocument,
  StopInstanceDocument,
} from "../../sdk/client.ts";
import { eventViolations, waitForState } from "../support/hosts.ts";
import { invariantViolations } from "../support/ledger.ts";
import { type Cluster, startCluster } from "./processes.ts";

let c: Cluster;
beforeAll(async () => {
  c = await startCluster({ hosts: 3 });
});
afterAll(async () => {
  const errors = c?.errors() ?? [];
  if (errors.length) console.error(`process errors:\n${errors.slice(0, 20).join("\n")}`);
  await c?.close();
});

describe("server, worker and three agents as separate processes", () => {
  it("converge instances through their whole lifecycle, and survive a server restart", async () => {
    const { createTenant } = await c.operator.request(CreateTenantDocument, { input: { name: "e2e" } });
    const { createApiToken } = await c.operator.request(CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "e2e" } });
    const t = c.client(createApiToken.token);
    const ids: string[] = [];
    for (let i = 0; i < 6; i++)
      ids.push((await t.request(CreateInstanceDocument, { input: { poolId: c.poolId, flavor: "tiny", imageId: c.imageId } })).createInstance.id);
    for (const id of ids) await waitForState(t, id, "RUNNING", 30_000);
    const [a, b] = ids as [string, string];

    await t.request(StopInstanceDocument, { id: a });
    await waitForState(t, a, "STOPPED");
    await t.request(ResizeInstanceDocument, { id: a, flavor: "small" });
    const resized = await waitForState(t, a, "STOPPED");
    expect(resized).toMatchObject({ flavor: "small", vcpus: 2 });
    await t.request(StartInstanceDocument, { id: a });
    await waitForState(t, a, "RUNNING");

    // The server goes away and comes back: agents reconnect and take the latest spec.
    await c.restartServer();
    await t.request(StopInstanceDocument, { id: b });
    await waitForState(t, b, "STOPPED", 30_000);

    for (const id of ids) await t.request(DeleteInstanceDocument, { id });
    for (const id of ids) await waitForState(t, id, "DELETED", 30_000);
    await c.inspect(async (p) => {
      expect(await invariantViolations(p)).toEqual([]);
      expect(await eventViolations({ platform: p })).toEqual([]);
    });
  });
});
