import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { isAppError } from "../../contracts/errors.ts";
import { formatIpv4, isLeasable, leasableCount, parseIpv4, parseRange } from "../../core/pools/hosted/ipam.ts";

describe("IPv4 ranges", () => {
  it("round-trips addresses", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 32 - 1 }), (n) => {
        expect(parseIpv4(formatIpv4(n))).toBe(n);
      }),
    );
  });
  it("rejects malformed addresses", () => {
    for (const bad of ["1.2.3", "1.2.3.4.5", "256.0.0.1", "01.2.3.4", "a.b.c.d", "1.2.3.-4", ""]) expect(parseIpv4(bad)).toBeUndefined();
  });
  it("parses a /24 with the first host as gateway", () => {
    const r = parseRange("10.20.30.0/24");
    expect(r).toMatchObject({ cidr: "10.20.30.0/24", prefix: 24, size: 256, gatewayOffset: 1 });
    expect(leasableCount(r)).toBe(253);
  });
  it("excludes network, broadcast and gateway, whatever the prefix and gateway", () => {
    fc.assert(
      fc.property(fc.integer({ min: 16, max: 30 }), fc.integer({ min: 0, max: 2 ** 32 - 1 }), fc.nat(), (prefix, addr, g) => {
        const size = 2 ** (32 - prefix);
        const network = addr - (addr % size);
        const gw = network + 1 + (g % (size - 2));
        const r = parseRange(`${formatIpv4(network)}/${prefix}`, formatIpv4(gw));
        const leasable = Array.from({ length: Math.min(size, 64) }, (_, o) => o).filter((o) => isLeasable(r, o));
        expect(leasable).not.toContain(0);
        expect(leasable).not.toContain(r.gatewayOffset);
        expect(isLeasable(r, size - 1)).toBe(false);
        if (size <= 64) expect(leasable.length).toBe(leasableCount(r));
      }),
    );
  });
  it("refuses what is not a usable range, as INVALID_INPUT", () => {
    for (const bad of ["10.0.0.0/8", "10.0.0.0/31", "10.0.0.1/24", "10.0.0.0", "x/24", "10.0.0.0/24/1"]) {
      try {
        parseRange(bad);
        expect.unreachable(bad);
      } catch (e) {
        expect(isAppError(e, "INVALID_INPUT")).toBe(true);
      }
    }
    expect(() => parseRange("10.0.0.0/24", "10.0.1.1")).toThrow(/not a host address/);
    expect(() => parseRange("10.0.0.0/24", "10.0.0.255")).toThrow(/not a host address/);
  });
});
