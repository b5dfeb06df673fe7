import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateApiTokenDocument, CreateInstanceDocument, CreateTenantDocument, InstanceSnapshotDocument, SnapshotInstanceDocument } from "../../sdk/client.ts";
import { until } from "../support/fixtures.ts";
import { eventViolations, waitForState } from "../support/hosts.ts";
import { invariantViolations } from "../support/ledger.ts";
import { type Cluster, startCluster } from "./processes.ts";

/**
 * A host command across crashes, with separate processes: the agent is killed in the middle of a snapshot (its
 * fake hypervisor takes two seconds over each operation, the snapshot's spent with the domain saved and off)
 * and the server is restarted meanwhile. The restarted agent finds the command in its journal, finishes it,
 * and the reconciler settles it; the instance never looks powered off.
 */

let c: Cluster;
beforeAll(async () => {
  // A long silence grace: this test is about the command, not about a host being marked lost while it restarts.
  c = await startCluster({ hosts: 1, agentArgs: ["--delay-ms", "2000"], env: { NODE_LOST_GRACE_MS: "60000" } });
});
afterAll(async () => {
  const errors = c?.errors() ?? [];
  if (errors.length) console.error(`process errors:\n${errors.slice(0, 20).join("\n")}`);
  await c?.close();
});

const journals = () => {
  const dir = join(c.root, "host-1", "commands");
  return existsSync(dir)
    ? readdirSync(dir)
        .filter((f) => f.endsWith(".json"))
        .map((f) => JSON.parse(readFileSync(join(dir, f), "utf8")) as { state: string })
    : [];
};

describe("a host command across an agent crash and a server restart", () => {
  it("runs to the end once the agent is back, and settles", async () => {
    const { createTenant } = await c.operator.request(CreateTenantDocument, { input: { name: "e2e-cmd" } });
    const { createApiToken } = await c.operator.request(CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "e2e" } });
    const t = c.client(createApiToken.token);
    const { createInstance: vm } = await t.request(CreateInstanceDocument, { input: { poolId: c.poolId, flavor: "tiny", imageId: c.imageId } });
    await waitForState(t, vm.id, "RUNNING", 60_000);

    const { snapshotInstance: snap } = await c.operator.request(SnapshotInstanceDocument, { id: vm.id });
    await until("the agent to take the command", () => journals().some((j) => j.state === "running"), 30_000, 20);
    await c.restartAgent(0, "SIGKILL");
    await c.restartServer();

    const snapshot = async () => (await c.operator.request(InstanceSnapshotDocument, { id: snap.id })).instanceSnapshot;
    await expect.poll(async () => (await snapshot())?.state, { timeout: 60_000, interval: 200 }).toBe("READY");
    expect((await snapshot())?.sizeBytes).toBeGreaterThan(0);
    expect(journals().map((j) => j.state)).toEqual(["succeeded"]);
    expect(existsSync(join(c.root, "host-1", "fake-host", "snapshots", vm.id, snap.id))).toBe(true);
    await waitForState(t, vm.id, "RUNNING", 30_000);
    await c.inspect(async (p) => {
      const reasons = (await p.db.prisma.instanceEvent.findMany({ where: { instanceId: vm.id }, orderBy: { version: "asc" } })).map((e) => e.reason);
      expect(reasons).toContain("snapshot:ready");
      // The save had the domain off when the agent died; no report ever said so.
      expect(reasons).not.toContain("host:powered-off");
      expect(await invariantViolations(p)).toEqual([]);
      expect(await eventViolations({ platform: p })).toEqual([]);
    });
  });
});
