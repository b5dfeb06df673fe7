import { z } from "zod";
import type { Machine, MachineStatus } from "../../core/pools/provider/contract.ts";

/** The labels that tie a Hetzner server to our instance and to this deployment. */
export const INSTANCE_LABEL = "bc-instance";
export const MANAGED_BY_LABEL = "bc-managed-by";

// Only the fields we read; zod drops the rest, so Hetzner adding fields never breaks parsing.
export const serverSchema = z.object({
  id: z.number(),
  name: z.string(),
  status: z.string(),
  labels: z.record(z.string(), z.string()).nullish(),
  public_net: z
    .object({
      ipv4: z.object({ ip: z.string() }).nullish(),
      ipv6: z.object({ ip: z.string() }).nullish(),
    })
    .nullish(),
});
export type Server = z.infer<typeof serverSchema>;

export const actionSchema = z.object({
  id: z.number(),
  command: z.string().optional(),
  status: z.string(),
  error: z.object({ code: z.string().optional(), message: z.string().optional() }).nullish(),
});
export type Action = z.infer<typeof actionSchema>;

export const serverTypeSchema = z.object({
  name: z.string(),
  cores: z.number(),
  memory: z.number(),
  disk: z.number(),
  deprecated: z.boolean().nullish(),
  deprecation: z.unknown().nullish(),
  locations: z.array(z.object({ name: z.string(), available: z.boolean().nullish(), deprecation: z.unknown().nullish() })).nullish(),
  prices: z.array(z.object({ location: z.string() })).nullish(),
});
export type ServerType = z.infer<typeof serverTypeSchema>;

export const sshKeySchema = z.object({ id: z.number(), name: z.string(), fingerprint: z.string().optional() });

const STATUS: Record<string, MachineStatus> = {
  initializing: "creating",
  starting: "starting",
  running: "running",
  stopping: "stopping",
  off: "stopped",
  deleting: "deleting",
};

export function toMachine(server: Server): Machine {
  const addresses: string[] = [];
  const v4 = server.public_net?.ipv4?.ip;
  if (v4) addresses.push(v4);
  const v6 = server.public_net?.ipv6?.ip;
  const host = v6 ? firstHost(v6) : null;
  if (host) addresses.push(host);
  return {
    externalId: String(server.id),
    instanceId: server.labels?.[INSTANCE_LABEL] ?? null,
    status: STATUS[server.status] ?? "unknown",
    addresses,
  };
}

/** Whether a server type may be offered: not deprecated, and sold where the account puts its servers. */
export function offerable(type: ServerType, location: string | undefined): boolean {
  if (type.deprecated || type.deprecation) return false;
  if (!location) return true;
  if (type.locations) return type.locations.some((l) => l.name === location && l.available !== false && !l.deprecation);
  return (type.prices ?? []).some((p) => p.location === location);
}

/**
 * Hetzner gives a server an IPv6 network (`2001:db8:1:2::/64`) and configures its first address, `…::1`, on
 * the interface; that is the address to reach it on.
 */
export function firstHost(network: string): string | null {
  const [addr, prefix] = network.split("/");
  if (!addr) return null;
  if (prefix === undefined) return addr;
  const halves = addr.split("::");
  if (halves.length > 2) return null;
  const head = halves[0] ? halves[0].split(":") : [];
  const tail = halves.length === 2 && halves[1] ? halves[1].split(":") : [];
  const fill = halves.length === 2 ? 8 - head.length - tail.length : 0;
  if (fill < 0) return null;
  const groups = [...head, ...Array<string>(fill).fill("0"), ...tail].map((g) => (/^[0-9a-f]{1,4}$/i.test(g) ? Number.parseInt(g, 16) : Number.NaN));
  if (groups.length !== 8 || groups.some(Number.isNaN)) return null;
  groups[7] = (groups[7] ?? 0) + 1;
  if (groups[7] > 0xffff) return null;
  return compress(groups);
}

function compress(groups: number[]): string {
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) [best, bestLen] = [i, j - i];
    i = j > i ? j : i + 1;
  }
  const hex = groups.map((g) => g.toString(16));
  if (best < 0) return hex.join(":");
  return `${hex.slice(0, best).join(":")}::${hex.slice(best + bestLen).join(":")}`;
}
