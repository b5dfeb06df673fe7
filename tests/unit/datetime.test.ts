import { describe, expect, it } from "vitest";
import { parseDateTime } from "../../server/schema/builder.ts";

/** The DateTime scalar: the RFC 3339 forms it takes, and dates that do not exist refused rather than rolled over. */
const refused = (v: unknown) => {
  try {
    parseDateTime(v);
  } catch (e) {
    return (e as { extensions?: { code?: string } }).extensions?.code;
  }
  return "accepted";
};

describe("DateTime", () => {
  it("takes RFC 3339 instants with a four-digit year, with or without seconds and fractions, in UTC or at an offset", () => {
    expect(parseDateTime("2030-01-01T00:00:00Z").toISOString()).toBe("2030-01-01T00:00:00.000Z");
    expect(parseDateTime("2030-01-01t00:00z").toISOString()).toBe("2030-01-01T00:00:00.000Z");
    expect(parseDateTime("2030-01-01T01:30:00.123456789+01:30").toISOString()).toBe("2030-01-01T00:00:00.123Z");
    expect(parseDateTime("2028-02-29T23:59:59-23:59").toISOString()).toBe("2028-03-01T23:58:59.000Z");
    expect(parseDateTime("2000-02-29T00:00:00Z").toISOString()).toBe("2000-02-29T00:00:00.000Z");
    expect(parseDateTime("0001-01-01T00:00:00Z").getUTCFullYear()).toBe(1);
    expect(parseDateTime("9999-12-31T23:59:59.999Z").getUTCFullYear()).toBe(9999);
  });

  it("refuses dates and times that do not exist as INVALID_INPUT, instead of rolling them over", () => {
    for (const v of [
      "2030-02-30T00:00:00Z",
      "2030-02-29T00:00:00Z", // not a leap year
      "2100-02-29T00:00:00Z", // nor is a century not divisible by 400
      "2030-04-31T00:00:00Z",
      "2030-13-01T00:00:00Z",
      "2030-00-10T00:00:00Z",
      "2030-01-00T00:00:00Z",
      "2030-01-32T00:00:00Z",
      "2030-01-01T24:00:00Z",
      "2030-01-01T23:60:00Z",
      "2030-01-01T23:59:60Z",
      "2030-01-01T00:00:00+24:00",
      "2030-01-01T00:00:00+01:60",
      "0000-01-01T00:00:00Z",
      "2030-02-30",
      "2030-01-01",
      "+012030-01-01T00:00:00Z",
      "2030-01-01 00:00:00Z",
      "",
      1893456000000,
      null,
    ])
      expect([v, refused(v)]).toEqual([v, "INVALID_INPUT"]);
  });
});
