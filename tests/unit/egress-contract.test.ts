import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { renderRuleset } from "../../agent/network/ruleset.ts";
import { type AllowRule, formatAllowEntry, parseAllowEntry, parseCidr } from "../../contracts/egress.ts";
import { hostSpecChange, type NetworkPolicy, networkPolicy, nodeSpecChange } from "../../contracts/host.ts";

/** The one parser of egress destinations: what the API takes, the host protocol carries and the host's ruleset holds. */

const entry = (s: string) => {
  const r = parseAllowEntry(s);
  return "rule" in r ? r.rule : null;
};
const renders = (allow: AllowRule[]) => renderRuleset(new Map<string, NetworkPolicy>([["bct1", { egress: "allowlist", allow }]]), { tapPrefix: "bct" });

describe("parseCidr", () => {
  it.each([
    ["10.0.0.1", 4, 32, "10.0.0.1/32"],
    ["10.0.0.1/32", 4, 32, "10.0.0.1/32"],
    ["10.1.2.3/8", 4, 8, "10.0.0.0/8"],
    ["0.0.0.0/0", 4, 0, "0.0.0.0/0"],
    ["255.255.255.255/31", 4, 31, "255.255.255.254/31"],
    ["::", 6, 128, "::/128"],
    ["::/0", 6, 0, "::/0"],
    ["2001:DB8::1/32", 6, 32, "2001:db8::/32"],
    ["2001:0db8:0:0:1:0:0:1", 6, 128, "2001:db8::1:0:0:1/128"],
    ["1:0:0:2:0:0:0:3", 6, 128, "1:0:0:2::3/128"],
    ["1:0:1:0:1:0:1:0", 6, 128, "1:0:1:0:1:0:1:0/128"],
    ["::ffff:1.2.3.4", 6, 128, "::ffff:102:304/128"],
    ["1:2:3:4:5:6:7:8", 6, 128, "1:2:3:4:5:6:7:8/128"],
    ["1::", 6, 128, "1::/128"],
  ])("%s is %s", (input, family, prefix, text) => {
    expect(parseCidr(input)).toEqual({ family, prefix, text });
  });

  it.each([
    "010.000.000.001/32",
    "010.0.0.1",
    "10.0.0.00",
    "10.0.0.0/08",
    "10.0.0.0/33",
    "10.0.0.0/",
    "256.1.1.1",
    "10.0.0.-1",
    "1.2.3",
    "1.2.3.4.5",
    "10.0.0.0/8 accept; flush ruleset",
    " 10.0.0.1",
    "",
    "::g",
    "1::2::3",
    "1:2:3:4:5:6:7:8:9",
    "1:2:3:4:5:6:7",
    "12345::",
    "fe80::1%eth0",
    "::/129",
    "::/0128",
    "any",
    "0x0a000001",
  ])("refuses %j", (input) => {
    expect(parseCidr(input)).toBeNull();
  });
});

describe("allow entries", () => {
  it.each([
    ["10.0.0.0/8:443/tcp", "10.0.0.0/8:443/tcp"],
    ["1.1.1.1/32:*/udp", "1.1.1.1/32:*/udp"],
    ["10.1.2.3/8:65535/tcp", "10.0.0.0/8:65535/tcp"],
    ["2001:DB8::1/32:*/udp", "2001:db8::/32:*/udp"],
    ["fd00::/8:53/udp", "fd00::/8:53/udp"],
  ])("%s is stored as %s", (input, canonical) => {
    const rule = entry(input);
    expect(rule && formatAllowEntry(rule)).toBe(canonical);
  });

  it.each([
    ["010.000.000.001/32:80/tcp", /^"010\.000\.000\.001\/32:80\/tcp": "010\.000\.000\.001\/32" is not an IPv4 or IPv6 CIDR/],
    ["10.0.0.1:80/tcp", /is not "CIDR\/LENGTH:PORT\/PROTO"/],
    ["fd00::1:443/tcp", /is not "CIDR\/LENGTH:PORT\/PROTO"/],
    ["10.0.0.0/33:80/tcp", /is not an IPv4 or IPv6 CIDR/],
    ["256.0.0.0/8:80/tcp", /is not an IPv4 or IPv6 CIDR/],
    ["10.0.0.0/8:0/tcp", /the port must be 1 to 65535/],
    ["10.0.0.0/8:65536/tcp", /the port must be 1 to 65535/],
    ["10.0.0.0/8:080/tcp", /the port must be 1 to 65535/],
    ["10.0.0.0/8:/tcp", /the port must be 1 to 65535/],
    ["10.0.0.0/8:443/icmp", /the protocol must be tcp or udp/],
    ["10.0.0.0/8:443/TCP", /the protocol must be tcp or udp/],
    ["10.0.0.0/8:443", /is not "CIDR\/LENGTH:PORT\/PROTO"/],
    ["", /is not "CIDR\/LENGTH:PORT\/PROTO"/],
    [`10.0.0.0/8:443/tcp${" ".repeat(200)}`, /at most 128 characters/],
  ])("refuses %j", (input, why) => {
    const r = parseAllowEntry(input);
    expect("error" in r && r.error).toMatch(why);
  });

  const v4 = fc.tuple(fc.nat(255), fc.nat(255), fc.nat(255), fc.nat(255)).map((o) => o.join("."));
  const hextet = fc.nat(0xffff).chain((g) => fc.constantFrom(g.toString(16), g.toString(16).toUpperCase(), g.toString(16).padStart(4, "0")));
  const v6 = fc.tuple(fc.array(hextet, { minLength: 8, maxLength: 8 }), fc.nat(7), fc.nat(8)).map(([gs, at, len]) => {
    // Sometimes compressed: a run of groups written as "::" (whatever they held, they now read as zeros).
    if (len < 2 || at + len > 8) return gs.join(":");
    return `${gs.slice(0, at).join(":")}::${gs.slice(at + len).join(":")}`;
  });
  const cidr = fc.oneof(
    fc.tuple(v4, fc.nat(32)).map(([a, p]) => `${a}/${p}`),
    fc.tuple(v6, fc.nat(128)).map(([a, p]) => `${a}/${p}`),
  );
  const written = fc
    .tuple(cidr, fc.oneof(fc.constant("*"), fc.integer({ min: 1, max: 65535 }).map(String)), fc.constantFrom("tcp", "udp"))
    .map(([c, p, proto]) => `${c}:${p}/${proto}`);

  it("takes every well-written entry, in a canonical form that is its own canonical form and that every host renders", () => {
    fc.assert(
      fc.property(written, (s) => {
        const rule = entry(s);
        expect(rule).not.toBeNull();
        const r = rule as AllowRule;
        expect(entry(formatAllowEntry(r))).toEqual(r);
        expect(networkPolicy.parse({ egress: "allowlist", allow: [r] }).allow).toEqual([r]);
        expect(renders([r])).toContain(` daddr ${r.cidr} `);
      }),
      { numRuns: 500 },
    );
  });

  it("never takes an entry a host would refuse, whatever the text", () => {
    const alphabet = fc.constantFrom(..."0123456789abcdefABCDEF:./*tcpud x%;-");
    fc.assert(
      fc.property(fc.oneof(written, fc.string({ unit: alphabet, maxLength: 40 })), (s) => {
        const r = parseAllowEntry(s);
        if ("error" in r) expect(r.error).toContain(JSON.stringify(s));
        else {
          expect(() => renders([r.rule])).not.toThrow();
          expect(entry(formatAllowEntry(r.rule))).toEqual(r.rule);
        }
      }),
      { numRuns: 2000 },
    );
  });
});

describe("the host protocol", () => {
  const inst = (id: string, network: unknown) => ({
    id,
    power: "running",
    vcpus: 1,
    memoryMib: 512,
    diskGib: 10,
    gpus: [],
    image: { url: "https://images.example/base.qcow2", sha256: "d".repeat(64), format: "qcow2" },
    sshKeys: [],
    userData: null,
    hostname: "h",
    nic: { bridge: "br0", mac: "52:54:00:00:00:01", address: null, prefix: null, gateway: null },
    ...(network === undefined ? {} : { network }),
  });
  const bad = { egress: "allowlist", allow: [{ cidr: "010.000.000.001/32", port: 80, proto: "tcp" }] };
  const change = { nodeId: "node_x", generation: 2, since: null, runtime: "fake", dropped: [], remove: [] };

  it("refuses, in a spec, an address its hosts would refuse", () => {
    expect(networkPolicy.safeParse(bad).success).toBe(false);
    expect(nodeSpecChange.safeParse({ ...change, instances: [inst("inst_a", bad)] }).success).toBe(false);
    expect(networkPolicy.parse({ egress: "allowlist", allow: [{ cidr: "10.1.2.3/8", port: null, proto: "udp" }] }).allow).toHaveLength(1);
  });

  it("is read by a host with each policy as sent, so one bad policy costs its instance alone (the converger's check)", () => {
    const read = hostSpecChange.parse({ ...change, instances: [inst("inst_a", bad), inst("inst_b", undefined)] });
    expect(read.instances.map((i) => i.network)).toEqual([bad, { egress: "all", allow: [] }]);
    expect(hostSpecChange.safeParse({ ...change, instances: [{ ...inst("inst_a", bad), power: "on" }] }).success).toBe(false);
  });
});
