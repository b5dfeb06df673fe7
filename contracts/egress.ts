import { z } from "zod";

/**
 * Sandboxes' egress destinations: the one parser the API (core/sandboxes/templates.ts), the host protocol
 * (host.ts) and the host's nftables ruleset (agent/network/ruleset.ts) share, so an entry the API takes is one
 * every host enforces. Whatever a policy says ends up inside an nft script, so an address is parsed into numbers
 * and printed back from them: only text this module wrote is ever stored, sent or rendered.
 */

export interface Cidr {
  family: 4 | 6;
  prefix: number;
  /**
   * The canonical form: the network address (host bits cleared: 10.1.2.3/8 is 10.0.0.0/8, as ip(8) reads it),
   * always with `/prefix`; IPv6 in lower case, compressed as RFC 5952 says (hex only, no dotted tail).
   */
  text: string;
}

/** No leading zeros: 010 is octal to some tools and decimal to others, so it means nothing certain. */
const V4_OCTET = /^(?:0|[1-9][0-9]{0,2})$/;
const HEXTET = /^[0-9a-fA-F]{1,4}$/;

function parseV4(s: string): number | null {
  const parts = s.split(".");
  if (parts.length !== 4) return null;
  let n = 0;
  for (const p of parts) {
    if (!V4_OCTET.test(p) || Number(p) > 255) return null;
    n = n * 256 + Number(p);
  }
  return n;
}

function parseV6(s: string): bigint | null {
  // An embedded dotted quad (::ffff:1.2.3.4) counts as the last two hextets.
  let tail: string[] = [];
  let head = s;
  const lastColon = s.lastIndexOf(":");
  if (s.slice(lastColon + 1).includes(".")) {
    const v4 = parseV4(s.slice(lastColon + 1));
    if (v4 === null) return null;
    tail = [(v4 >>> 16).toString(16), (v4 & 0xffff).toString(16)];
    head = s.slice(0, lastColon + 1);
    // "::1.2.3.4" leaves "::"; "a::1.2.3.4" leaves "a::"; "a:b:…:1.2.3.4" leaves a trailing ":" to drop.
    if (head.endsWith(":") && !head.endsWith("::")) head = head.slice(0, -1);
  }
  const halves = head.split("::");
  if (halves.length > 2) return null;
  const split = (h: string) => (h === "" ? [] : h.split(":"));
  const left = split(halves[0] as string);
  const right = halves.length === 2 ? split(halves[1] as string) : [];
  const given = [...left, ...right, ...tail];
  if (!given.every((g) => HEXTET.test(g))) return null;
  const missing = 8 - given.length;
  if (halves.length === 2 ? missing < 1 : missing !== 0) return null;
  const groups = halves.length === 2 ? [...left, ...Array(missing).fill("0"), ...right, ...tail] : given;
  return groups.reduce((acc, g) => (acc << 16n) | BigInt(Number.parseInt(g, 16)), 0n);
}

const v4Text = (n: number) => [24, 16, 8, 0].map((sh) => (n >>> sh) & 255).join(".");

/** RFC 5952: the longest run of two or more zero groups (the first of equals) becomes "::". */
function v6Text(n: bigint): string {
  const groups = Array.from({ length: 8 }, (_, i) => Number((n >> BigInt(112 - 16 * i)) & 0xffffn));
  let best = { at: -1, len: 1 };
  for (let i = 0; i < 8; ) {
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > best.len) best = { at: i, len: j - i };
    i = j === i ? i + 1 : j;
  }
  const hex = (gs: number[]) => gs.map((g) => g.toString(16)).join(":");
  return best.at < 0 ? hex(groups) : `${hex(groups.slice(0, best.at))}::${hex(groups.slice(best.at + best.len))}`;
}

/** `addr` or `addr/prefix`, IPv4 or IPv6, in canonical form; null for anything else. */
export function parseCidr(input: unknown): Cidr | null {
  if (typeof input !== "string" || input.length > 64 || !/^[0-9a-fA-F:.]+(?:\/(?:0|[1-9][0-9]{0,2}))?$/.test(input)) return null;
  const [addr = "", lenText] = input.split("/");
  if (!addr.includes(":")) {
    const n = parseV4(addr);
    const prefix = lenText === undefined ? 32 : Number(lenText);
    if (n === null || prefix > 32) return null;
    const mask = prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
    return { family: 4, prefix, text: `${v4Text((n & mask) >>> 0)}/${prefix}` };
  }
  const n = parseV6(addr);
  const prefix = lenText === undefined ? 128 : Number(lenText);
  if (n === null || prefix > 128) return null;
  const mask = prefix === 0 ? 0n : ((1n << BigInt(prefix)) - 1n) << BigInt(128 - prefix);
  return { family: 6, prefix, text: `${v6Text(n & mask)}/${prefix}` };
}

/** A CIDR as the host protocol carries it: anything parseCidr takes (a host renders its canonical form). */
export const egressCidr = z.string().refine((s) => parseCidr(s) !== null, { error: (iss) => `not a CIDR: ${JSON.stringify(iss.input)}` });

export const egressProtos = ["tcp", "udp"] as const;

/** One allowed destination; `port` null: every port. */
export interface AllowRule {
  cidr: string;
  port: number | null;
  proto: (typeof egressProtos)[number];
}

const ENTRY_FORM = '"CIDR/LENGTH:PORT/PROTO" (PORT 1-65535 or *, PROTO tcp or udp), e.g. "10.0.0.0/8:443/tcp" or "fd00::/8:*/udp"';

/**
 * An API allow entry, `CIDR/LENGTH:PORT/PROTO`, as its canonical rule, or why it is not one. The length is
 * required (without it "fd00::1:443/tcp" would read two ways); nothing has leading zeros.
 */
export function parseAllowEntry(entry: string): { rule: AllowRule } | { error: string } {
  if (entry.length > 128) return { error: `an entry is ${ENTRY_FORM}, at most 128 characters` };
  const q = JSON.stringify(entry);
  const slash = entry.lastIndexOf("/");
  const colon = entry.lastIndexOf(":", slash);
  const cidrText = entry.slice(0, Math.max(colon, 0));
  if (slash < 0 || colon < 0 || !cidrText.includes("/")) return { error: `${q} is not ${ENTRY_FORM}` };
  const cidr = parseCidr(cidrText);
  if (!cidr) return { error: `${q}: ${JSON.stringify(cidrText)} is not an IPv4 or IPv6 CIDR (no leading zeros, octets up to 255, a length the family allows)` };
  const portText = entry.slice(colon + 1, slash);
  const port = portText === "*" ? null : /^[1-9][0-9]{0,4}$/.test(portText) && Number(portText) <= 65535 ? Number(portText) : undefined;
  if (port === undefined) return { error: `${q}: the port must be 1 to 65535 (no leading zeros) or *` };
  const proto = entry.slice(slash + 1);
  if (proto !== "tcp" && proto !== "udp") return { error: `${q}: the protocol must be tcp or udp` };
  return { rule: { cidr: cidr.text, port, proto } };
}

/** The entry form of a rule (its canonical form when the rule came from parseAllowEntry). */
export const formatAllowEntry = (r: AllowRule) => `${r.cidr}:${r.port ?? "*"}/${r.proto}`;

/** Zod for an API allow entry: the canonical rule, or an issue naming the entry and what is wrong with it. */
export const allowEntry = z.string().transform((s, ctx): AllowRule => {
  const r = parseAllowEntry(s);
  if ("rule" in r) return r.rule;
  ctx.addIssue({ code: "custom", message: r.error });
  return z.NEVER;
});
