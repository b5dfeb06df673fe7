import { describe, expect, it } from "vitest";
import { DEFAULT_TAP_PREFIX, Egress, renderClear, renderRuleset } from "../../agent/network/egress.ts";
import { type NetworkPolicy, tapFor } from "../../contracts/host.ts";

/** renderRuleset without nft: what reaches the script, and what is refused before it could. */

const opts = { tapPrefix: "bct" };
const ALLOW: NetworkPolicy = {
  egress: "allowlist",
  allow: [
    { cidr: "10.99.0.0/24", port: 80, proto: "tcp" },
    { cidr: "10.98.0.2", port: null, proto: "udp" },
    { cidr: "fd00::1/64", port: 443, proto: "tcp" },
  ],
};
const render = (entries: [string, unknown][], o: { tapPrefix: string; table?: string } = opts) =>
  renderRuleset(new Map(entries) as Map<string, NetworkPolicy>, o);

describe("renderRuleset", () => {
  it("replaces exactly our two tables and holds the backstop for taps no policy names", () => {
    const out = render([]);
    const touched = [...out.matchAll(/^\s*(?:add |delete )?table (\w+) (\w+)/gm)].map((m) => `${m[1]} ${m[2]}`);
    expect(new Set(touched)).toEqual(new Set(["bridge bc_egress", "inet bc_egress"]));
    expect(out).toMatch(/^add table bridge bc_egress\ndelete table bridge bc_egress\nadd table inet bc_egress\ndelete table inet bc_egress$/m);
    expect(out).not.toMatch(/flush ruleset/);
    // Other interfaces pass first; a tap of ours with no map entry keeps mark 0 and is dropped.
    expect(out).toContain('iifname != "bct*" accept');
    expect(out).toContain("meta mark set 0x00000000\n    meta mark set iifname map @tap_mark\n    meta mark 0x00000000 counter drop");
    expect(out).not.toContain("elements");
    expect(render([], { tapPrefix: "vm", table: "other" })).toContain("table bridge other {\n  map tap_mark");
  });

  it("gives each tap its class in the mark, and an allowlist its own chain of canonical rules", () => {
    const out = render([
      ["bct1", { egress: "none", allow: [] }],
      ["bct2", ALLOW],
      ["bct3", { egress: "all", allow: [] }],
    ]);
    expect(out).toContain('"bct1" : 0x7e010001');
    expect(out).toContain('"bct2" : 0x7e020002');
    expect(out).toContain('"bct3" : 0x7e030003');
    expect(out).toContain("0x7e020002 : jump allow_2");
    const chain = out.slice(out.indexOf("chain allow_2 {"), out.indexOf("}", out.indexOf("chain allow_2 {")));
    expect(
      chain
        .split("\n")
        .slice(2)
        .map((l) => l.trim())
        .filter(Boolean),
    ).toEqual(["ip daddr 10.98.0.2/32 meta l4proto udp accept", "ip daddr 10.99.0.0/24 tcp dport 80 accept", "ip6 daddr fd00::/64 tcp dport 443 accept"]);
    expect(out).toContain("reject with icmpx type admin-prohibited");
  });

  it("is deterministic: the same policies in any order, with duplicates, render the same bytes", () => {
    const a = render([
      ["bct1", { egress: "none", allow: [] }],
      ["bct2", ALLOW],
    ]);
    const b = render([
      ["bct2", { ...ALLOW, allow: [...ALLOW.allow, ...ALLOW.allow].reverse() }],
      ["bct1", { egress: "none" }],
    ]);
    expect(b).toBe(a);
    expect(render([["bct2", { egress: "allowlist", allow: [{ cidr: "10.1.2.3/8", port: 1, proto: "tcp" }] }]])).toContain("ip daddr 10.0.0.0/8 tcp dport 1");
  });

  it.each([
    "",
    'bct"; flush ruleset; "',
    "bct*",
    "bct 1",
    "bct1\n",
    "bct}",
    "bct123456789abcd", // 16 characters
    "eth0", // not ours: it would go unpoliced
    "bctä",
  ])("refuses the tap name %j", (tap) => {
    expect(() => render([[tap, { egress: "all", allow: [] }]])).toThrow(/egress: (bad tap name|tap .* does not start)/);
  });

  it.each([
    "10.0.0.0/8 accept; flush ruleset",
    "10.0.0.0/8 }",
    '10.0.0.0"',
    "10.0.0.0/33",
    "10.0.0.0/08",
    "10.0.0.0/",
    "256.1.1.1",
    "1.2.3",
    "1.2.3.4.5",
    "010.0.0.1",
    "10.0.0.-1",
    "",
    "::g",
    "1::2::3",
    "1:2:3:4:5:6:7:8:9",
    "1:2:3:4:5:6:7",
    "fe80::1%eth0",
    "::/129",
    "any",
    "0x0a000001",
  ])("refuses the CIDR %j", (cidr) => {
    expect(() => render([["bct1", { egress: "allowlist", allow: [{ cidr, port: 80, proto: "tcp" }] }]])).toThrow(
      /^egress: bad policy for bct1: policy\.allow\.0\.cidr: not a CIDR/,
    );
  });

  it.each([
    [{ egress: "allowlist", allow: [{ cidr: "10.0.0.0/8", port: 0, proto: "tcp" }] }],
    [{ egress: "allowlist", allow: [{ cidr: "10.0.0.0/8", port: "80 accept", proto: "tcp" }] }],
    [{ egress: "allowlist", allow: [{ cidr: "10.0.0.0/8", port: 80, proto: "icmp" }] }],
    [{ egress: "open", allow: [] }],
    [null],
  ])("refuses the policy %j", (policy) => {
    expect(() => render([["bct1", policy]])).toThrow(/egress: bad policy for bct1/);
  });

  it("refuses a bad prefix or table name", () => {
    expect(() => render([], { tapPrefix: 'bct" accept' })).toThrow(/bad tap prefix/);
    expect(() => render([], { tapPrefix: "" })).toThrow(/bad tap prefix/);
    expect(() => render([], { tapPrefix: "bct", table: "x; flush ruleset" })).toThrow(/bad table name/);
    expect(() => renderClear("inet x")).toThrow(/bad table name/);
  });

  it("clears only our tables", () => {
    expect(renderClear()).toBe("add table bridge bc_egress\ndelete table bridge bc_egress\nadd table inet bc_egress\ndelete table inet bc_egress\n");
  });
});

describe("Egress", () => {
  it("uses the prefix tapFor names carry", () => {
    const tap = tapFor("inst_abcdefghijklmnopqrstuvwxyz234567abcdefghijklmnopqrst");
    expect(tap.startsWith(DEFAULT_TAP_PREFIX)).toBe(true);
    expect(render([[tap, { egress: "none", allow: [] }]])).toContain(`"${tap}" : 0x7e010001`);
  });

  it("refuses bad options, and bad policies before running anything", async () => {
    expect(() => new Egress({ netns: "a b" })).toThrow(/bad netns/);
    expect(() => new Egress({ tapPrefix: "*" })).toThrow(/bad tap prefix/);
    // A binary that does not exist: had apply got as far as running it, the error would say so.
    const e = new Egress({ nft: "/nonexistent/nft" });
    await expect(e.apply(new Map([["bct;", { egress: "all", allow: [] }]]))).rejects.toThrow(/bad tap name/);
    await expect(e.clear()).rejects.toThrow(/not found/);
  });
});
