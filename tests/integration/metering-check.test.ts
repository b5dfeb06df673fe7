import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateInstanceDocument, DeleteInstanceDocument, ResizeInstanceDocument, StartInstanceDocument, StopInstanceDocument } from "../../sdk/client.ts";
import { type Hosts, startHosts, waitForState } from "../support/hosts.ts";
import { meteringViolations } from "../support/ledger.ts";

/**
 * The fault suite's metering check (tests/support/ledger.ts) must itself catch what it is there for: a window
 * counted twice, time held but never counted, spans that overlap. Each case plants one in a copy of a quiet
 * history and expects the check to name it.
 */
let hosts: Hosts;
beforeAll(async () => {
  hosts = await startHosts(1);
  await hosts.start(0);
});
afterAll(() => hosts?.close());

describe("the metering check", () => {
  it("passes a real history and names a double count, a gap and an overlap planted in it", async () => {
    const t = await hosts.h.tenant();
    const { createInstance: inst } = await t.client.request(CreateInstanceDocument, {
      input: { poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId },
    });
    await waitForState(t.client, inst.id, "RUNNING");
    await t.client.request(StopInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "STOPPED");
    await t.client.request(ResizeInstanceDocument, { id: inst.id, flavor: "medium" });
    await t.client.request(StartInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "RUNNING");
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await waitForState(t.client, inst.id, "DELETED");

    const q = (text: string) => hosts.h.platform.db.prisma.$executeRawUnsafe(text);
    const spans = (await hosts.h.platform.db.prisma.$queryRawUnsafe<{ n: bigint }[]>(`SELECT count(*) AS n FROM meter_spans`))[0]?.n;
    expect(Number(spans)).toBe(2); // before and after the resize
    await q(`CREATE TABLE spans_kept AS SELECT * FROM meter_spans`);
    const again = async (plant: string) => {
      await q(`DELETE FROM usage_records`);
      await q(`DELETE FROM usage_windows`);
      await q(`DELETE FROM meter_spans`);
      await q(`INSERT INTO meter_spans SELECT * FROM spans_kept`);
      if (plant) await q(plant);
      return (await meteringViolations(hosts.h.platform)).join("\n");
    };

    expect(await again("")).toBe("");
    // A record no span explains: counted twice.
    expect(
      await again(`INSERT INTO usage_records (window_start, meter, tenant_id, project_id, instance_id, amount)
                        SELECT '2020-01-01', 'vps.vcpu.hours', tenant_id, project_id, instance_id, 1000 FROM spans_kept LIMIT 1`),
    ).toMatch(/counted twice/);
    // A span whose time was already taken as counted: never recorded.
    expect(await again(`UPDATE meter_spans SET metered_until = ended_at - interval '1 second' WHERE id = (SELECT min(id) FROM meter_spans)`)).toMatch(/a gap/);
    // Two spans of the instance at once.
    expect(
      await again(`UPDATE meter_spans SET started_at = started_at - interval '1 hour', metered_until = started_at - interval '1 hour'
                         WHERE started_at = (SELECT max(started_at) FROM meter_spans)`),
    ).toMatch(/overlap/);
  });
});
