import type { z } from "zod";
import { parseCidr } from "../../contracts/egress.ts";
import { type EgressRule, type NetworkPolicy, networkPolicy } from "../../contracts/host.ts";

/**
 * The egress ruleset as one `nft -f` script (pure; see egress.ts for the design and why). Everything a caller
 * passes is validated or re-printed from parsed values before it reaches the text: tap names against a strict
 * pattern, addresses through the contract's parseCidr (contracts/egress.ts), ports and protocols through its schema.
 */

export interface RenderOptions {
  /** Every tap of ours starts with it (tapFor names start with "bct"); other interfaces are left alone. */
  tapPrefix: string;
  /** Our tables' name, in both the bridge and the inet family. */
  table?: string;
}

export const DEFAULT_TABLE = "bc_egress";

/** The skb mark of a frame from one of our taps: 0x7e in the top byte, the class, then the tap's number. */
export const MARK_OURS = 0x7e000000;
const MARK_OURS_MASK = 0xff000000;
const CLASS_MASK = 0x00ff0000;
export const CLASS = { none: 0x00010000, allowlist: 0x00020000, all: 0x00030000 } as const;
const MAX_TAPS = 0xffff;

const TAP_NAME = /^[A-Za-z0-9_.-]{1,15}$/;
const TAP_PREFIX = /^[A-Za-z0-9_.-]{1,14}$/;
const TABLE_NAME = /^[A-Za-z][A-Za-z0-9_]{0,31}$/;

const hex = (n: number) => `0x${(n >>> 0).toString(16).padStart(8, "0")}`;

export function validateTableName(table: string): string {
  if (!TABLE_NAME.test(table)) throw new Error(`egress: bad table name ${JSON.stringify(table)}`);
  return table;
}

export function validateTapPrefix(prefix: string): string {
  if (!TAP_PREFIX.test(prefix)) throw new Error(`egress: bad tap prefix ${JSON.stringify(prefix)}`);
  return prefix;
}

/** Why the ruleset cannot hold a tap of this name, or null. */
export const tapRefusal = (tap: unknown): string | null => (typeof tap === "string" && TAP_NAME.test(tap) ? null : `bad tap name ${JSON.stringify(tap)}`);

/** Why the ruleset cannot hold this policy, or null: renderRuleset refuses exactly these (one tap's, not the host's). */
export function policyRefusal(policy: unknown): string | null {
  const parsed = networkPolicy.safeParse(policy);
  return parsed.success ? null : issues(parsed.error);
}

const issues = (e: z.ZodError) => e.issues.map((i) => `${["policy", ...i.path.map(String)].join(".")}: ${i.message}`).join("; ");

/** One nft rule (without the verdict) per allowlist entry; deduplicated and sorted so equal policies render equally. */
function allowRules(allow: readonly EgressRule[]): string[] {
  const lines = new Set<string>();
  for (const r of allow) {
    // The schema already ran the same parser; this only turns its text into nft's.
    const cidr = parseCidr(r.cidr);
    if (!cidr) throw new Error(`egress: not a CIDR: ${JSON.stringify(r.cidr)}`);
    const { family, text } = cidr;
    const dst = family === 4 ? `ip daddr ${text}` : `ip6 daddr ${text}`;
    // proto and port come from the schema's enum and integer range; printed from those, never from raw text.
    const proto = r.proto === "tcp" ? "tcp" : "udp";
    lines.add(r.port === null ? `${dst} meta l4proto ${proto} accept` : `${dst} ${proto} dport ${Number(r.port)} accept`);
  }
  return [...lines].sort();
}

/** The script that removes our tables (and nothing else), whether or not they exist. */
export function renderClear(table: string = DEFAULT_TABLE): string {
  validateTableName(table);
  // `add` first so the `delete` never fails on a table that is not there: one idempotent transaction.
  return ["bridge", "inet"].flatMap((f) => [`add table ${f} ${table}`, `delete table ${f} ${table}`]).join("\n") + "\n";
}

export function renderRuleset(policies: ReadonlyMap<string, NetworkPolicy>, opts: RenderOptions): string {
  const prefix = validateTapPrefix(opts.tapPrefix);
  const table = validateTableName(opts.table ?? DEFAULT_TABLE);
  // Code-point order, not locale order: the same input gives the same bytes (and so the same tap numbers) anywhere.
  const taps = [...policies.keys()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  if (taps.length > MAX_TAPS) throw new Error(`egress: ${taps.length} taps; at most ${MAX_TAPS} fit in the mark`);

  const marks: string[] = [];
  const allowMap: string[] = [];
  const allowChains: string[] = [];
  taps.forEach((tap, i) => {
    const badTap = tapRefusal(tap);
    if (badTap) throw new Error(`egress: ${badTap}`);
    // A listed tap outside the prefix would silently go unpoliced (the chains accept such interfaces first).
    if (!tap.startsWith(prefix)) throw new Error(`egress: tap ${tap} does not start with the tap prefix ${prefix}`);
    const parsed = networkPolicy.safeParse(policies.get(tap));
    if (!parsed.success) throw new Error(`egress: bad policy for ${tap}: ${issues(parsed.error)}`);
    const policy = parsed.data;
    const mark = (MARK_OURS | CLASS[policy.egress] | (i + 1)) >>> 0;
    marks.push(`"${tap}" : ${hex(mark)}`);
    if (policy.egress === "allowlist") {
      const rules = allowRules(policy.allow);
      allowMap.push(`${hex(mark)} : jump allow_${i + 1}`);
      allowChains.push(`  chain allow_${i + 1} {`, `    # ${tap}`, ...rules.map((r) => `    ${r}`), "  }");
    }
  });

  const ours = `meta mark & ${hex(MARK_OURS_MASK)} == ${hex(MARK_OURS)}`;
  const cls = (c: keyof typeof CLASS) => `meta mark & ${hex(CLASS_MASK)} == ${hex(CLASS[c])}`;
  const elements = (items: string[]) => (items.length ? [`    elements = { ${items.join(",\n      ")} }`] : []);
  const wildcard = `"${prefix}*"`;

  return [
    `# egress policy for ${taps.length} tap(s) with prefix ${prefix}; generated, replaced whole on every change`,
    ...renderClear(table).trimEnd().split("\n"),
    `table bridge ${table} {`,
    "  map tap_mark {",
    "    type ifname : mark",
    ...elements(marks),
    "  }",
    "  chain prerouting {",
    "    type filter hook prerouting priority -200; policy accept;",
    `    iifname != ${wildcard} accept`,
    // Start from 0 so "no element for this tap" is exactly "mark 0" below.
    "    meta mark set 0x00000000",
    "    meta mark set iifname map @tap_mark",
    // Backstop: a tap of ours that no policy names yet (just created, not yet classified) sends nothing.
    "    meta mark 0x00000000 counter drop",
    `    ${cls("all")} accept`,
    "    ether type arp accept",
    // Allowlist IP goes on to the inet table, which has conntrack; any other ethertype (VLAN-tagged, raw L2) stops here.
    `    ${cls("allowlist")} ether type { ip, ip6 } accept`,
    // none: DHCP only; the inet input chain lets it reach the host (the gateway) and forward refuses it elsewhere.
    "    ether type ip udp sport 68 udp dport 67 accept",
    "    counter drop",
    "  }",
    "}",
    `table inet ${table} {`,
    "  map allow_chain {",
    "    type mark : verdict",
    ...elements(allowMap),
    "  }",
    ...allowChains,
    "  chain guest_egress {",
    // The guest is answering a connection someone else opened (inbound to it): not egress.
    "    ct direction reply accept",
    `    ${cls("all")} accept`,
    // Every packet the guest originates is checked, established or not: a downgrade cuts flows it no longer allows.
    "    meta mark vmap @allow_chain",
    `    ${cls("allowlist")} icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept`,
    "    reject with icmpx type admin-prohibited",
    "  }",
    "  chain input {",
    "    type filter hook input priority 0; policy accept;",
    // A tap outside any bridge reaches L3 under its own name, where the bridge chain never saw it: unpoliced, so dropped.
    `    iifname ${wildcard} counter drop`,
    `    ${ours} udp sport 68 udp dport 67 accept`,
    `    ${ours} jump guest_egress`,
    "  }",
    "  chain forward {",
    "    type filter hook forward priority 0; policy accept;",
    `    iifname ${wildcard} counter drop`,
    `    ${ours} jump guest_egress`,
    "  }",
    "}",
    "",
  ].join("\n");
}
