import { describe, expect, it } from "vitest";
import { ClassifiedError, categoryOf, Destinations, parseCidr, parseIp } from "../../agent/runtimes/fetch-guard.ts";

const category = (address: string) => {
  const ip = parseIp(address);
  if (!ip) throw new Error(`not an address: ${address}`);
  return categoryOf(ip);
};

describe("image destinations", () => {
  it("names what is not the public internet, in every form an address can take", () => {
    const cases: [string, string | null][] = [
      ["127.0.0.1", "loopback"],
      ["127.255.0.9", "loopback"],
      ["::1", "loopback"],
      ["169.254.169.254", "link-local"],
      ["fe80::1", "link-local"],
      ["febf:ffff::1", "link-local"],
      ["10.1.2.3", "private"],
      ["172.16.0.1", "private"],
      ["172.31.255.255", "private"],
      ["192.168.1.1", "private"],
      ["100.64.0.1", "private"],
      ["100.127.255.254", "private"],
      ["fc00::1", "private"],
      ["fd00:ec2::254", "private"],
      ["0.0.0.0", "unspecified"],
      ["::", "unspecified"],
      ["224.0.0.1", "multicast"],
      ["ff02::1", "multicast"],
      ["255.255.255.255", "reserved"],
      ["192.0.0.192", "reserved"],
      // IPv4 inside IPv6: mapped (both spellings), NAT64 and 6to4 carry their IPv4 address's category.
      ["::ffff:127.0.0.1", "loopback"],
      ["::ffff:7f00:1", "loopback"],
      ["::ffff:169.254.169.254", "link-local"],
      ["::ffff:a00:1", "private"],
      ["64:ff9b::a9fe:a9fe", "link-local"],
      ["2002:c0a8:0101::1", "private"],
      ["::127.0.0.1", "reserved"],
      ["[::1]", "loopback"],
      // The public internet.
      ["8.8.8.8", null],
      ["172.32.0.1", null],
      ["100.128.0.1", null],
      ["2a00:1450:4001:80b::200e", null],
      ["::ffff:8.8.8.8", null],
      ["64:ff9b::808:808", null],
    ];
    expect(cases.map(([a]) => [a, category(a)])).toEqual(cases);
  });

  it("refuses when any resolved address is refused, unless the operator's list holds it", () => {
    const none = new Destinations();
    expect(none.refused(["93.184.216.34"])).toBeNull();
    expect(none.refused(["93.184.216.34", "10.0.0.7"])).toEqual({ address: "10.0.0.7", category: "private" });
    expect(none.refused(["not-an-address"])).toEqual({ address: "not-an-address", category: "reserved" });

    const loopback = new Destinations({ allow: ["127.0.0.0/8", "::1"], allowHttp: false });
    expect(loopback.refused(["127.0.0.1", "::1"])).toBeNull();
    // Mapped forms are allowed through the IPv4 range they carry.
    expect(loopback.refused(["::ffff:127.0.0.1"])).toBeNull();
    expect(loopback.refused(["127.0.0.1", "169.254.169.254"])).toEqual({ address: "169.254.169.254", category: "link-local" });
    expect(new Destinations({ allow: ["10.20.0.0/16"], allowHttp: false }).refused(["10.21.0.1"])).toEqual({ address: "10.21.0.1", category: "private" });
  });

  it("allows https always, http only where the operator says so, nothing else", () => {
    expect(new Destinations().schemeAllowed("https:")).toBe(true);
    expect(new Destinations().schemeAllowed("http:")).toBe(false);
    expect(new Destinations({ allow: [], allowHttp: true }).schemeAllowed("http:")).toBe(true);
    expect(new Destinations({ allow: [], allowHttp: true }).schemeAllowed("file:")).toBe(false);
  });

  it("reads CIDRs and single addresses, and nothing else", () => {
    expect(parseCidr("10.0.0.0/8")).toMatchObject({ family: 4, prefix: 8 });
    expect(parseCidr("fd00::/8")).toMatchObject({ family: 6, prefix: 8 });
    expect(parseCidr("127.0.0.1")).toMatchObject({ family: 4, prefix: 32 });
    for (const bad of ["10.0.0.0/33", "::/129", "10.0.0/8", "localhost", "10.0.0.0/8/1", "10.0.0.0/-1", ""]) expect(parseCidr(bad)).toBeNull();
    expect(() => new Destinations({ allow: ["nope"], allowHttp: false })).toThrow(/not a CIDR/);
  });

  it("tells the tenant the reason and keeps the particulars for the host's log", () => {
    const e = new ClassifiedError("image source refused: private destination", false, "https://x resolves to 10.0.0.7");
    expect(e.message).toBe("image source refused: private destination");
    expect(String(e)).toBe("RuntimeError: image source refused: private destination (https://x resolves to 10.0.0.7)");
    expect(e.retryable).toBe(false);
  });
});
