import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { closeWindow, meterUsage, type UsageRow } from "../../core/books/usage.ts";
import {
  CreateInstanceDocument,
  CreateSandboxDocument,
  CreateSandboxTemplateDocument,
  DeleteInstanceDocument,
  DeleteSandboxDocument,
  InstanceDocument,
  SandboxTemplateDocument,
  StartInstanceDocument,
  StopInstanceDocument,
  UsageDocument,
} from "../../sdk/client.ts";
import { until } from "../support/fixtures.ts";
import { expectCode } from "../support/harness.ts";
import { type Hosts, startHosts } from "../support/hosts.ts";

/**
 * Metering on an injected clock, through the real API, worker and simulated hosts: what each instance held is
 * counted to the millisecond into 5-minute windows, exactly once however the job is run (again, twice at once,
 * killed half-way), and read back by `usage` and `/usage.csv`.
 */
const T0 = Date.parse("2030-01-01T00:02:30Z");
let clock = T0;
const at = (minutes: number) => {
  clock = T0 + minutes * 60_000;
};
let hosts: Hosts;
let t: Awaited<ReturnType<Hosts["h"]["tenant"]>>;

beforeAll(async () => {
  // Hosts report on the platform's clock: a grace longer than any jump here keeps them from going lost.
  hosts = await startHosts(1, { NODE_LOST_GRACE_MS: String(24 * 3600_000), SANDBOX_SWEEP_MS: "200" }, { now: () => new Date(clock) });
  await hosts.start(0);
  t = await hosts.h.tenant();
});
afterAll(() => hosts?.close());

const meter = () => meterUsage((fn) => hosts.h.platform.write({ actor: "usage" }, fn));
const stateOf = async (id: string) => (await t.client.request(InstanceDocument, { id })).instance?.state;
const waitState = (id: string, want: string) => until(`${id} ${want}`, async () => (await stateOf(id)) === want, 20_000);
const usageOf = async (groupBy: ("TENANT" | "INSTANCE" | "METER" | "PROJECT" | "HOUR" | "DAY")[] = ["INSTANCE"], who = hosts.h.operator) =>
  (await who.request(UsageDocument, { from: new Date(T0 - 3600_000).toISOString(), to: new Date(T0 + 24 * 3600_000).toISOString(), groupBy })).usage;
const find = (rows: UsageRow[] | Awaited<ReturnType<typeof usageOf>>, meterName: string, instanceId?: string) =>
  rows.find((r) => r.meter === meterName && (instanceId === undefined || r.instanceId === instanceId))?.quantity;

describe("metering", () => {
  it("counts an instance's 37 minutes across window edges, a stop and start included, exactly once however the job runs", async () => {
    at(0);
    const { createInstance: inst } = await t.client.request(CreateInstanceDocument, {
      input: { poolId: hosts.poolId, flavor: "medium", imageId: hosts.imageId },
    });
    await waitState(inst.id, "RUNNING");
    at(11.25); // stopped and started inside one window: the allocation is held throughout, and counted so
    await t.client.request(StopInstanceDocument, { id: inst.id });
    await waitState(inst.id, "STOPPED");
    at(12.5);
    await t.client.request(StartInstanceDocument, { id: inst.id });
    await waitState(inst.id, "RUNNING");
    at(37);
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await waitState(inst.id, "DELETED");

    // Windows close a minute after they end: at 00:44:30 the last one closed is 00:35–00:40.
    at(42);
    expect(await meter()).toBe(8); // 00:00 … 00:35
    // Killed half-way: the window's records and its marker go together, or not at all.
    await expect(
      hosts.h.platform.write({ actor: "usage" }, async (w) => {
        await closeWindow(w);
        throw new Error("worker killed");
      }),
    ).rejects.toThrow("worker killed");
    // Two workers at once: they take turns, and the second finds nothing left.
    at(120);
    const [a, b] = await Promise.all([meter(), meter()]);
    expect(a + b).toBe(16); // 00:40 … 01:55
    expect(await meter()).toBe(0);

    const rows = await usageOf();
    expect(find(rows, "vps.vcpu.hours", inst.id)).toBeCloseTo((37 / 60) * 2, 9);
    expect(find(rows, "vps.memory.gib.hours", inst.id)).toBeCloseTo((37 / 60) * 2, 9);
    const windows = await hosts.h.platform.read((sql) =>
      sql.query<{ n: number; windows: number }>(
        `SELECT count(*)::int AS n, count(DISTINCT window_start)::int AS windows FROM usage_records WHERE instance_id = $1`,
        [inst.id],
      ),
    );
    expect(windows[0]).toEqual({ n: 16, windows: 8 }); // vCPU and memory, in each of the 8 windows it touched
  });

  it("counts a warm instance as the operator's until it is claimed, then the tenant's", async () => {
    at(120);
    const { createSandboxTemplate: tpl } = await t.client.request(CreateSandboxTemplateDocument, {
      input: { name: "warm", poolId: hosts.poolId, flavor: "small", imageId: hosts.imageId, ttlSeconds: 3600, warm: 1 },
    });
    await until("the warm instance ready", async () => (await t.client.request(SandboxTemplateDocument, { id: tpl.id })).sandboxTemplate?.warm.ready === 1);
    at(130);
    const { createSandbox: s } = await t.client.request(CreateSandboxDocument, { input: { templateId: tpl.id } });
    expect(s.warm).toBe(true);
    at(136);
    await t.client.request(DeleteSandboxDocument, { id: s.id });
    await waitState(s.instance.id, "DELETED");
    at(150);
    await meter();
    const rows = await usageOf(["TENANT", "INSTANCE"]);
    const warm = rows.find((r) => r.meter === "vps.sandbox.warm" && r.instanceId === s.instance.id);
    expect(warm).toMatchObject({ tenantId: null, unit: "instance-hours" });
    expect(warm?.quantity).toBeCloseTo(10 / 60, 9);
    const claimed = rows.find((r) => r.meter === "vps.vcpu.hours" && r.instanceId === s.instance.id);
    expect(claimed).toMatchObject({ tenantId: t.id });
    expect(claimed?.quantity).toBeCloseTo(6 / 60, 9);
  });

  it("counts whole what a writer with a lagging clock records in windows already closed, in the next one", async () => {
    at(100); // windows up to 02:25 are closed: this clock is behind them
    const { createInstance: inst } = await t.client.request(CreateInstanceDocument, {
      input: { poolId: hosts.poolId, flavor: "medium", imageId: hosts.imageId },
    });
    await waitState(inst.id, "RUNNING");
    at(200);
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await waitState(inst.id, "DELETED");
    at(260);
    await meter();
    expect(find(await usageOf(), "vps.vcpu.hours", inst.id)).toBeCloseTo((100 / 60) * 2, 9);
  });

  it("splits usage by the UTC hour or day its windows start in, summing to the same total", async () => {
    at(300); // 05:02:30
    const { createInstance: inst } = await t.client.request(CreateInstanceDocument, {
      input: { poolId: hosts.poolId, flavor: "medium", imageId: hosts.imageId },
    });
    await waitState(inst.id, "RUNNING");
    at(400); // 06:42:30
    await t.client.request(DeleteInstanceDocument, { id: inst.id });
    await waitState(inst.id, "DELETED");
    at(410);
    while ((await meter()) > 0);
    const vcpu = (rows: Awaited<ReturnType<typeof usageOf>>) => rows.filter((r) => r.meter === "vps.vcpu.hours" && r.instanceId === inst.id);
    const hourly = vcpu(await usageOf(["INSTANCE", "HOUR"]));
    expect(hourly.map((r) => [r.start, Number(r.quantity.toFixed(9))])).toEqual([
      ["2030-01-01T05:00:00.000Z", Number(((57.5 / 60) * 2).toFixed(9))],
      ["2030-01-01T06:00:00.000Z", Number(((42.5 / 60) * 2).toFixed(9))],
    ]);
    const daily = vcpu(await usageOf(["INSTANCE", "DAY"]));
    expect(daily.map((r) => r.start)).toEqual(["2030-01-01T00:00:00.000Z"]);
    expect(daily[0]?.quantity).toBeCloseTo((100 / 60) * 2, 9);
    expect(vcpu(await usageOf(["INSTANCE"]))[0]?.start).toBeNull();
  });

  it("shows tenants their own usage only, and serves the same rows as CSV with the same auth", async () => {
    const own = await usageOf(["TENANT"], t.client);
    expect(own.length).toBeGreaterThan(0);
    expect(own.every((r) => r.tenantId === t.id)).toBe(true);
    const other = await hosts.h.tenant();
    expect(await usageOf(["TENANT"], other.client)).toEqual([]);
    await expectCode(other.client.request(UsageDocument, { from: new Date(T0).toISOString(), to: new Date(clock).toISOString(), tenantId: t.id }), "NOT_FOUND");

    const url = (q: string) => `${hosts.h.url.replace(/\/graphql$/, "")}/usage.csv?${q}`;
    const range = `from=${new Date(T0 - 3600_000).toISOString()}&to=${new Date(T0 + 24 * 3600_000).toISOString()}`;
    const csv = await fetch(url(`${range}&groupBy=tenant`), { headers: { authorization: `Bearer ${t.token}` } });
    expect(csv.status).toBe(200);
    expect(csv.headers.get("content-type")).toMatch(/^text\/csv/);
    const lines = (await csv.text()).trim().split("\r\n");
    expect(lines[0]).toBe("meter,tenantId,projectId,instanceId,quantity,unit,start");
    expect(lines.slice(1).sort()).toEqual(own.map((r) => [r.meter, r.tenantId, "", "", r.quantity, r.unit, ""].join(",")).sort());
    const hourly = await fetch(url(`${range}&groupBy=tenant,hour`), { headers: { authorization: `Bearer ${t.token}` } });
    expect(
      (await hourly.text())
        .trim()
        .split("\r\n")
        .slice(1)
        .every((l) => /,\d{4}-\d\d-\d\dT\d\d:00:00\.000Z$/.test(l)),
    ).toBe(true);
    expect((await fetch(url(range))).status).toBe(401);
    expect((await fetch(url("from=yesterday&to=now"), { headers: { authorization: `Bearer ${t.token}` } })).status).toBe(400);
    expect((await fetch(url(`${range}&tenantId=${other.id}`), { headers: { authorization: `Bearer ${t.token}` } })).status).toBe(404);
  });
});
