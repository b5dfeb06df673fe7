/**
 * Strict CIDR parsing for the egress ruleset. Whatever a policy says ends up inside an nft script, so an address
 * is parsed into numbers and printed back from them: the script only ever holds text this module wrote, never the
 * caller's. Host bits are cleared (10.1.2.3/8 means 10.0.0.0/8), as ip(8) and most firewalls read it.
 */

export interface Cidr {
  family: 4 | 6;
  /** The canonical text for nft: the network address, with `/len` unless it is a single address. */
  text: string;
}

const V4_OCTET = /^(?:0|[1-9][0-9]{0,2})$/;
const HEXTET = /^[0-9a-fA-F]{1,4}$/;

function parseV4(s: string): number | null {
  const parts = s.split(".");
  if (parts.length !== 4) return null;
  let n = 0;
  for (const p of parts) {
    if (!V4_OCTET.test(p)) return null;
    const v = Number(p);
    if (v > 255) return null;
    n = n * 256 + v;
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
  const left = split(halves[0]!);
  const right = halves.length === 2 ? split(halves[1]!) : [];
  const given = [...left, ...right, ...tail];
  if (!given.every((g) => HEXTET.test(g))) return null;
  const missing = 8 - given.length;
  if (halves.length === 2 ? missing < 1 : missing !== 0) return null;
  const groups = halves.length === 2 ? [...left, ...Array(missing).fill("0"), ...right, ...tail] : given;
  return groups.reduce((acc, g) => (acc << 16n) | BigInt(Number.parseInt(g, 16)), 0n);
}

const v4Text = (n: number) => [24, 16, 8, 0].map((sh) => (n >>> sh) & 255).join(".");
const v6Text = (n: bigint) => Array.from({ length: 8 }, (_, i) => ((n >> BigInt(112 - 16 * i)) & 0xffffn).toString(16)).join(":");

/** Parse `addr` or `addr/len` (IPv4 or IPv6); throws on anything else. */
export function parseCidr(input: string): Cidr {
  const bad = () => new Error(`egress: not a CIDR: ${JSON.stringify(input)}`);
  if (typeof input !== "string" || input.length > 64 || !/^[0-9a-fA-F:.]+(?:\/[0-9]{1,3})?$/.test(input)) throw bad();
  const [addr = "", lenText] = input.split("/");
  if (lenText !== undefined && !/^(?:0|[1-9][0-9]*)$/.test(lenText)) throw bad();
  if (!addr.includes(":")) {
    const n = parseV4(addr);
    const len = lenText === undefined ? 32 : Number(lenText);
    if (n === null || len > 32) throw bad();
    const mask = len === 0 ? 0 : (0xffffffff << (32 - len)) >>> 0;
    const net = (n & mask) >>> 0;
    return { family: 4, text: len === 32 ? v4Text(net) : `${v4Text(net)}/${len}` };
  }
  const n = parseV6(addr);
  const len = lenText === undefined ? 128 : Number(lenText);
  if (n === null || len > 128) throw bad();
  const mask = len === 0 ? 0n : ((1n << BigInt(len)) - 1n) << BigInt(128 - len);
  const net = n & mask;
  return { family: 6, text: len === 128 ? v6Text(net) : `${v6Text(net)}/${len}` };
}
