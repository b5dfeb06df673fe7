import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { base32, instanceId, randomIds } from "../../core/kernel/ids.ts";

describe("instance ids", () => {
  it("are inst_ and 52 base32 characters", () => {
    expect(instanceId("ten_a", "idn_b", "key")).toMatch(/^inst_[a-z2-7]{52}$/);
  });
  it("are a function of tenant, caller and key", () => {
    fc.assert(
      fc.property(fc.string(), fc.string(), fc.string(), (t, c, k) => {
        expect(instanceId(t, c, k)).toBe(instanceId(t, c, k));
      }),
    );
  });
  it("differ when any of the three differs, including by shifting characters between them", () => {
    const ids = new Set([instanceId("ab", "c", "k"), instanceId("a", "bc", "k"), instanceId("a", "b", "ck"), instanceId("a", "b", "c")]);
    expect(ids.size).toBe(4);
  });
  it("random ids carry their kind and do not repeat", () => {
    const many = new Set(Array.from({ length: 1000 }, () => randomIds("node")));
    expect(many.size).toBe(1000);
    for (const id of many) expect(id).toMatch(/^node_[a-z2-7]{26}$/);
  });
  it("base32 matches RFC 4648 test vectors (lower case, unpadded)", () => {
    const vectors: [string, string][] = [
      ["", ""],
      ["f", "my"],
      ["fo", "mzxq"],
      ["foo", "mzxw6"],
      ["foob", "mzxw6yq"],
      ["fooba", "mzxw6ytb"],
      ["foobar", "mzxw6ytboi"],
    ];
    for (const [input, out] of vectors) expect(base32(Buffer.from(input))).toBe(out);
  });
});
