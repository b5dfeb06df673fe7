import { lookup } from "node:dns/promises";
import { isIP, type LookupFunction } from "node:net";

/**
 * Which network addresses a request made on someone else's word may reach. A tenant's image source (fetched by
 * a host, agent/runtimes/fetch-guard.ts) and an operator's provider endpoint (called by the worker with a
 * credential, infra/provider-fetch.ts) would otherwise reach loopback services, the cloud's metadata endpoint
 * and the private network behind them. Both sides classify with this module, so they refuse the same things.
 */

/** What the operator allows beyond public https: CIDRs (or single addresses) and plain http. Default: neither. */
export interface AddressPolicy {
  allow: string[];
  allowHttp: boolean;
}

export const defaultAddressPolicy: AddressPolicy = { allow: [], allowHttp: false };

export type Category = "loopback" | "link-local" | "private" | "unspecified" | "multicast" | "reserved";

interface Ip {
  family: 4 | 6;
  value: bigint;
}
interface Cidr extends Ip {
  prefix: number;
}

/** An address as a family and a number; brackets and a zone are dropped. Null for anything else. */
export function parseIp(text: string): Ip | null {
  const s = (text.startsWith("[") && text.endsWith("]") ? text.slice(1, -1) : text).split("%")[0] as string;
  const family = isIP(s);
  if (family === 4) return { family, value: v4Value(s) };
  if (family === 6) return { family, value: v6Value(s) };
  return null;
}

const v4Value = (s: string) => s.split(".").reduce((v, octet) => (v << 8n) | BigInt(Number(octet)), 0n);

function v6Value(s: string): bigint {
  // A trailing dotted quad (::ffff:127.0.0.1) stands for the last two groups.
  const quad = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(s);
  const text = quad ? `${s.slice(0, quad.index)}${((v4Value(quad[0]) >> 16n) & 0xffffn).toString(16)}:${(v4Value(quad[0]) & 0xffffn).toString(16)}` : s;
  const [head, tail] = text.split("::") as [string, string | undefined];
  const h = head ? head.split(":") : [];
  const t = tail ? tail.split(":") : [];
  const groups = tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill("0"), ...t];
  return groups.reduce((v, g) => (v << 16n) | BigInt(Number.parseInt(g, 16)), 0n);
}

/** `10.0.0.0/8`, `::1/128`, or a single address (the whole width). Null when it is neither. */
export function parseCidr(text: string): Cidr | null {
  const [addr, bits, ...rest] = text.trim().split("/");
  const ip = rest.length ? null : parseIp(addr ?? "");
  if (!ip) return null;
  const width = ip.family === 4 ? 32 : 128;
  const prefix = bits === undefined ? width : /^\d{1,3}$/.test(bits) ? Number(bits) : Number.NaN;
  return prefix >= 0 && prefix <= width ? { ...ip, prefix } : null;
}

function within(ip: Ip, c: Cidr): boolean {
  if (ip.family !== c.family) return false;
  const shift = BigInt((c.family === 4 ? 32 : 128) - c.prefix);
  return ip.value >> shift === c.value >> shift;
}

// Not the public internet. Order matters only for ::/96, which holds the unspecified and loopback addresses
// listed before it.
const REFUSED: [Category, Cidr][] = (
  [
    ["unspecified", "0.0.0.0/8"],
    ["private", "10.0.0.0/8"],
    ["private", "100.64.0.0/10"], // carrier-grade NAT
    ["loopback", "127.0.0.0/8"],
    ["link-local", "169.254.0.0/16"], // with the clouds' metadata endpoint, 169.254.169.254
    ["private", "172.16.0.0/12"],
    ["reserved", "192.0.0.0/24"], // protocol assignments (and another cloud's metadata address)
    ["reserved", "192.0.2.0/24"],
    ["private", "192.168.0.0/16"],
    ["reserved", "198.18.0.0/15"],
    ["reserved", "198.51.100.0/24"],
    ["reserved", "203.0.113.0/24"],
    ["multicast", "224.0.0.0/4"],
    ["reserved", "240.0.0.0/4"], // with the broadcast address
    ["unspecified", "::/128"],
    ["loopback", "::1/128"],
    ["reserved", "::/96"], // IPv4-compatible, deprecated
    ["reserved", "100::/64"],
    ["private", "64:ff9b:1::/48"], // local-use NAT64
    ["reserved", "2001::/32"], // Teredo: the IPv4 address inside is obfuscated
    ["reserved", "2001:db8::/32"],
    ["private", "fc00::/7"], // unique local, with a cloud's IPv6 metadata address
    ["link-local", "fe80::/10"],
    ["private", "fec0::/10"], // site-local, deprecated
    ["multicast", "ff00::/8"],
  ] as const
).map(([category, cidr]) => [category, parseCidr(cidr) as Cidr]);

/** The IPv4 address an IPv6 one carries to the IPv4 network: mapped (::ffff:a.b.c.d), NAT64 (64:ff9b::/96), 6to4 (2002::/16). */
function embeddedV4(ip: Ip): Ip | null {
  if (ip.family !== 6) return null;
  const low = { family: 4 as const, value: ip.value & 0xffffffffn };
  if (ip.value >> 32n === 0xffffn || ip.value >> 32n === 0x64ff9b0000000000000000n) return low;
  if (ip.value >> 112n === 0x2002n) return { family: 4, value: (ip.value >> 80n) & 0xffffffffn };
  return null;
}

/** Why an address is not on the public internet, or null when it is. */
export function categoryOf(ip: Ip): Category | null {
  const v4 = embeddedV4(ip);
  if (v4) return categoryOf(v4);
  return REFUSED.find(([, c]) => within(ip, c))?.[0] ?? null;
}

/** The operator's policy, parsed once: which schemes and which addresses may be reached. */
export class Destinations {
  private readonly allowed: Cidr[];
  readonly allowHttp: boolean;

  constructor(policy: AddressPolicy = defaultAddressPolicy) {
    this.allowed = policy.allow.map((c) => {
      const parsed = parseCidr(c);
      if (!parsed) throw new Error(`not a CIDR: ${c}`);
      return parsed;
    });
    this.allowHttp = policy.allowHttp;
  }

  /** https, and http only where the operator allows it. */
  schemeAllowed(protocol: string): boolean {
    return protocol === "https:" || (protocol === "http:" && this.allowHttp);
  }

  /**
   * The first address that may not be reached, with why: outside the public internet and not in the
   * operator's list (an address counts as allowed in its own form or in the IPv4 form it carries). Null
   * when every one may.
   */
  refused(addresses: string[]): { address: string; category: Category } | null {
    for (const address of addresses) {
      const ip = parseIp(address);
      if (!ip) return { address, category: "reserved" };
      const category = categoryOf(ip);
      if (!category) continue;
      const forms = [ip, embeddedV4(ip)].filter((f): f is Ip => f !== null);
      if (!this.allowed.some((c) => forms.some((f) => within(f, c)))) return { address, category };
    }
    return null;
  }
}

/** One address a name resolved to. */
export interface Address {
  address: string;
  family: 4 | 6;
}
/** A name to addresses. The system resolver (getaddrinfo: hosts file, then DNS) unless one is given. */
export type Resolve = (hostname: string) => Promise<Address[]>;

export const systemResolve: Resolve = async (hostname) => (await lookup(hostname, { all: true, verbatim: true })) as Address[];

/** Connect only where the guard looked: a `lookup` that answers with the checked addresses and asks no one. */
export const pinnedLookup =
  (addresses: Address[]): LookupFunction =>
  (_host, options, callback) => {
    const first = addresses[0] as Address;
    if (options.all) (callback as (e: null, a: Address[]) => void)(null, addresses);
    else callback(null, first.address, first.family);
  };
