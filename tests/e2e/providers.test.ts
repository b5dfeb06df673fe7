import { execFileSync } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ProviderEmulator } from "../../providers/emulator.ts";
import { startHetznerEmulator } from "../../providers/hetzner-cloud/emulator.ts";
import { startProxmoxEmulator } from "../../providers/proxmox-ve/emulator.ts";
import {
  type Client,
  CreateApiTokenDocument,
  CreateFlavorDocument,
  CreateInstanceDocument,
  CreatePoolDocument,
  CreateProviderAccountDocument,
  CreateTenantDocument,
  createClient,
  DeleteInstanceDocument,
  InstanceDocument,
  ProviderAccountDocument,
  ProviderAccountsDocument,
  StartInstanceDocument,
  StopInstanceDocument,
} from "../../sdk/client.ts";
import { prng, until } from "../support/fixtures.ts";
import { invariantViolations } from "../support/ledger.ts";
import { EVENT_FIELDS, watcher } from "../support/live.ts";
import { providerEnv } from "../support/providers.ts";
import { type Cluster, startCluster } from "./processes.ts";

const TOKEN_VAR = "BC_E2E_HCLOUD_TOKEN";

/**
 * Provider pools as deployed: `bc server` and `bc worker` processes, two emulators over HTTP, one account per
 * provider (one credential by environment reference, one sealed on write). 100 instances are churned while
 * both providers fail a tenth of their calls and the worker is killed midway; then nothing may be left: no
 * machine made twice, none left after the grace, quota back to zero. Everything the run showed — API answers,
 * events, both processes' debug logs, the whole database — is searched for the credential values.
 */
describe("provider pools, as processes", () => {
  let cluster: Cluster;
  let hetzner: ProviderEmulator;
  let proxmox: ProviderEmulator;
  const answers: string[] = [];
  /** What the worker killed midway printed before it died. */
  const earlierWorkers: string[] = [];
  let op: Client;
  const recording: typeof fetch = async (input, init) => {
    const res = await fetch(input, init);
    answers.push(await res.clone().text());
    return res;
  };

  beforeAll(async () => {
    hetzner = await startHetznerEmulator({ actionMs: 50 });
    proxmox = await startProxmoxEmulator({ actionMs: 30 });
    cluster = await startCluster({
      hosts: 0,
      env: { ...providerEnv, LOG_LEVEL: "debug", [TOKEN_VAR]: hetzner.credentials.token as string, PROVIDER_ORPHAN_GRACE_MS: "1000", LIMIT_RATE_POINTS: "0" },
    });
    op = createClient({ url: cluster.url, token: cluster.operatorToken, fetch: recording });
  });
  afterAll(async () => {
    if (cluster) {
      const errors = cluster.errors();
      if (errors.length) console.error(errors.slice(0, 20).join("\n"));
      await cluster.close();
    }
    await hetzner?.close();
    await proxmox?.close();
  });

  it("churns 100 provider instances through failures and a killed worker, and leaves nothing behind", async () => {
    const events = watcher(cluster.url, cluster.operatorToken, `subscription { instanceEvents { ${EVENT_FIELDS} } }`, {});
    const pools: { poolId: string; image: string; emu: ProviderEmulator }[] = [];
    for (const [emu, credentials] of [
      [hetzner, { token: `env:${TOKEN_VAR}` }],
      [proxmox, { tokenSecret: { value: proxmox.credentials.tokenSecret } }],
    ] as const) {
      const { createProviderAccount } = await op.request(CreateProviderAccountDocument, {
        input: { name: emu.provider, provider: emu.provider, config: emu.config, credentials },
      });
      const { createPool } = await op.request(CreatePoolDocument, {
        input: { name: `${emu.provider}-pool`, class: "PROVIDER", providerAccountId: createProviderAccount.id },
      });
      await op.request(CreateFlavorDocument, { input: { poolId: createPool.id, name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 } });
      pools.push({ poolId: createPool.id, image: emu.images[0] as string, emu });
    }
    const { createTenant } = await op.request(CreateTenantDocument, { input: { name: "churn" } });
    const { createApiToken } = await op.request(CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "churn" } });
    const t = createClient({ url: cluster.url, token: createApiToken.token, fetch: recording });
    await until("both accounts' offers", async () => {
      const { providerAccounts } = await op.request(ProviderAccountsDocument);
      for (const a of providerAccounts) if (!(await op.request(ProviderAccountDocument, { id: a.id })).providerAccount?.offers.length) return false;
      return providerAccounts.length === 2;
    });

    const rand = prng(10);
    hetzner.failRandomly(0.1);
    proxmox.failRandomly(0.1);
    const ids: string[] = [];
    for (let i = 0; i < 100; i++) {
      const pool = pools[i % 5 === 0 ? 1 : 0] as (typeof pools)[number];
      const { createInstance } = await t.request(CreateInstanceDocument, {
        input: { poolId: pool.poolId, flavor: "small", imageId: pool.image, idempotencyKey: `churn-${i}` },
      });
      ids.push(createInstance.id);
      if (i === 50) {
        earlierWorkers.push(cluster.worker.out);
        await cluster.restartWorker("SIGKILL");
      }
      if (rand() < 0.3) {
        const target = ids[Math.floor(rand() * ids.length)] as string;
        const r = rand();
        const call =
          r < 0.5
            ? t.request(StopInstanceDocument, { id: target })
            : r < 0.75
              ? t.request(StartInstanceDocument, { id: target })
              : t.request(DeleteInstanceDocument, { id: target });
        await call.catch((e) => {
          if ((e as { code?: string }).code !== "PRECONDITION_FAILED") throw e;
        });
      }
    }
    for (const id of ids) await t.request(DeleteInstanceDocument, { id });
    const states = async () => Promise.all(ids.map(async (id) => (await t.request(InstanceDocument, { id })).instance?.state));
    await until("every instance to be deleted", async () => (await states()).every((s) => s === "DELETED"), 180_000, 250);
    hetzner.failRandomly(0);
    proxmox.failRandomly(0);
    await until("the providers to hold no machine of ours", () => hetzner.machines().length + proxmox.machines().length === 0, 30_000, 100);

    for (const emu of [hetzner, proxmox]) for (const [id, n] of emu.createdPerInstance()) expect(n, `${emu.provider} made ${id} ${n} times`).toBe(1);
    expect(await cluster.inspect((p) => invariantViolations(p))).toEqual([]);
    expect(await cluster.inspect((p) => p.db.prisma.$queryRawUnsafe(`SELECT tenant_id, resource, used FROM quota_usage WHERE used <> 0`))).toEqual([]);
    await until("events of every instance", () => new Set(events.events.map((e) => (e as { instance: { id: string } }).instance.id)).size >= ids.length);
    await events.dispose();

    // The credentials: nowhere in what anyone could see.
    const secrets = [hetzner.credentials.token, proxmox.credentials.tokenSecret] as string[];
    const dump = execFileSync("pg_dump", ["--data-only", cluster.dbUrl], { maxBuffer: 512 * 1024 * 1024 }).toString();
    const places: [string, string][] = [
      ["API answers", answers.join("\n")],
      ["events", JSON.stringify(events.events)],
      ["server output", cluster.server.out],
      ["worker output", [...earlierWorkers, cluster.worker.out].join("\n")],
      ["database", dump],
    ];
    expect(places.find(([, text]) => text.includes("provider"))?.[0], "the haystacks are not empty").toBeDefined();
    expect(cluster.worker.out.length, "the worker logged at debug").toBeGreaterThan(1000);
    for (const [where, text] of places) for (const s of secrets) expect(text.includes(s), `a credential appears in ${where}`).toBe(false);
  }, 300_000);
});
