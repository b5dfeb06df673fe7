import { randomBytes } from "node:crypto";
import type { ProviderEmulator } from "../../providers/emulator.ts";
import { startHetznerEmulator } from "../../providers/hetzner-cloud/emulator.ts";
import { startProxmoxEmulator } from "../../providers/proxmox-ve/emulator.ts";
import {
  CreateFlavorDocument,
  CreateInstanceDocument,
  CreatePoolDocument,
  CreateProviderAccountDocument,
  InstanceDocument,
  ProviderOffersDocument,
} from "../../sdk/client.ts";
import { until } from "./fixtures.ts";
import { type Harness, testAllowances } from "./harness.ts";

/** Every provider plugin and its emulator: the conformance suite runs each case against each. */
export const emulators: Record<string, (o: { actionMs: number }) => Promise<ProviderEmulator>> = {
  "hetzner-cloud": startHetznerEmulator,
  "proxmox-ve": startProxmoxEmulator,
};

/** Timing for provider tests: quick polls and sweeps, a short orphan grace. */
export const providerEnv = {
  // Processes started apart from the harness (tests/e2e, tests/faults) take the emulators' allowance from here.
  ...testAllowances,
  PROVIDERS: Object.keys(emulators).join(","),
  PROVIDER_POLL_MIN_MS: "20",
  PROVIDER_POLL_MAX_MS: "200",
  PROVIDER_SWEEP_MS: "300",
  PROVIDER_ORPHAN_GRACE_MS: "600",
  // Longer than BullMQ's 5 s job lock: a worker blocked past that (its stdout pipe full under debug logging)
  // has its job run again beside it, and must still hold the lease; a killed worker's lease runs out in time.
  PROVIDER_CREATE_LEASE_MS: "10000",
  RECONCILE_SWEEP_MS: "500",
};

export interface ProviderPool {
  accountId: string;
  poolId: string;
  image: string;
}

/**
 * A provider account on the emulator (its credentials given as values, so sealed at rest), a pool on it with
 * flavors, and the offers read by the worker (which must be running).
 */
export async function providerPool(
  h: Harness,
  emu: ProviderEmulator,
  flavors = [{ name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 }],
): Promise<ProviderPool> {
  const tag = randomBytes(3).toString("hex");
  const { createProviderAccount } = await h.operator.request(CreateProviderAccountDocument, {
    input: {
      name: `${emu.provider}-${tag}`,
      provider: emu.provider,
      config: emu.config,
      credentials: Object.fromEntries(Object.entries(emu.credentials).map(([k, value]) => [k, { value }])),
    },
  });
  const { createPool } = await h.operator.request(CreatePoolDocument, {
    input: { name: `cloud-${tag}`, class: "PROVIDER", providerAccountId: createProviderAccount.id },
  });
  for (const f of flavors) await h.operator.request(CreateFlavorDocument, { input: { poolId: createPool.id, ...f, gpus: null } });
  await until("the provider's offers to be read", async () => {
    const { providerOffers } = await h.operator.request(ProviderOffersDocument, { poolId: createPool.id });
    return providerOffers.length > 0;
  });
  return { accountId: createProviderAccount.id, poolId: createPool.id, image: emu.images[0] as string };
}

export async function createProviderInstance(
  client: Harness["operator"],
  pool: ProviderPool,
  extra: { idempotencyKey?: string; desiredState?: "RUNNING" | "STOPPED"; flavor?: string } = {},
) {
  const { createInstance } = await client.request(CreateInstanceDocument, {
    input: {
      poolId: pool.poolId,
      flavor: extra.flavor ?? "small",
      imageId: pool.image,
      sshKeys: [],
      idempotencyKey: extra.idempotencyKey ?? `k-${randomBytes(8).toString("hex")}`,
      ...(extra.desiredState ? { desiredState: extra.desiredState } : {}),
    },
  });
  return createInstance;
}

export async function instanceOf(client: Harness["operator"], id: string) {
  const { instance } = await client.request(InstanceDocument, { id });
  if (!instance) throw new Error(`instance ${id} not found`);
  return instance;
}
