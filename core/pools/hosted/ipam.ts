import { invalid } from "../../../contracts/errors.ts";

/**
 * IPv4 ranges as integers. Leases are offsets from the network address; the network, the broadcast and the
 * gateway offsets are never leased.
 */
export interface Range {
  cidr: string;
  network: number;
  prefix: number;
  size: number;
  gatewayOffset: number;
}

export const MIN_PREFIX = 16; // 65,534 hosts: beyond that a pool's lease scan stops being cheap
export const MAX_PREFIX = 30; // the smallest range with one address after the gateway

export function parseIpv4(text: string): number | undefined {
  const parts = text.split(".");
  if (parts.length !== 4) return undefined;
  let n = 0;
  for (const p of parts) {
    if (!/^(0|[1-9][0-9]{0,2})$/.test(p)) return undefined;
    const v = Number(p);
    if (v > 255) return undefined;
    n = n * 256 + v;
  }
  return n;
}

export const formatIpv4 = (n: number) => [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join(".");

export function parseRange(cidr: string, gateway?: string): Range {
  const m = /^([0-9.]+)\/([0-9]{1,2})$/.exec(cidr.trim());
  const addr = m ? parseIpv4(m[1] as string) : undefined;
  const prefix = m ? Number(m[2]) : Number.NaN;
  if (addr === undefined || !(prefix >= MIN_PREFIX && prefix <= MAX_PREFIX)) {
    throw invalid(`ipv4Range must be an IPv4 CIDR from /${MIN_PREFIX} to /${MAX_PREFIX}, got ${cidr}`, { path: "input.ipv4Range" });
  }
  const size = 2 ** (32 - prefix);
  const network = addr - (addr % size);
  if (network !== addr) throw invalid(`ipv4Range ${cidr} has host bits set; did you mean ${formatIpv4(network)}/${prefix}?`, { path: "input.ipv4Range" });
  let gatewayOffset = 1;
  if (gateway !== undefined) {
    const g = parseIpv4(gateway);
    if (g === undefined || g <= network || g >= network + size - 1)
      throw invalid(`gateway ${gateway} is not a host address of ${cidr}`, { path: "input.ipv4Gateway" });
    gatewayOffset = g - network;
  }
  return { cidr: `${formatIpv4(network)}/${prefix}`, network, prefix, size, gatewayOffset };
}

/** Addresses that can be leased: all but network, broadcast and gateway. */
export const leasableCount = (r: Pick<Range, "size">) => r.size - 3;

export function isLeasable(r: Pick<Range, "size" | "gatewayOffset">, offset: number): boolean {
  return offset > 0 && offset < r.size - 1 && offset !== r.gatewayOffset;
}
