import { createHash, randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { sealer } from "../../core/kernel/seal.ts";

describe("sealed user data", () => {
  const s = sealer(randomBytes(32).toString("base64"));
  it("opens what it sealed, for the same instance", () => {
    const sealed = s.seal("#cloud-config\nruncmd: [echo hi]", "inst_a");
    expect(Buffer.from(sealed).toString()).not.toContain("cloud-config");
    expect(s.open(sealed, "inst_a")).toBe("#cloud-config\nruncmd: [echo hi]");
  });
  it("refuses a blob moved onto another instance", () => {
    expect(() => s.open(s.seal("secret", "inst_a"), "inst_b")).toThrow();
  });
  it("refuses a tampered blob and another key", () => {
    const sealed = s.seal("secret", "inst_a");
    const tampered = Uint8Array.from(sealed);
    tampered[tampered.length - 1] = (tampered[tampered.length - 1] as number) ^ 1;
    expect(() => s.open(tampered, "inst_a")).toThrow();
    expect(() => sealer(randomBytes(32).toString("base64")).open(sealed, "inst_a")).toThrow();
  });
  it("uses a fresh nonce each time", () => {
    expect(Buffer.from(s.seal("x", "i")).equals(Buffer.from(s.seal("x", "i")))).toBe(false);
  });
  it("digests with a key: stable for the same input, unrelated to the plain hash, different under another key or context", () => {
    const data = JSON.stringify(["pool_a", "small", "#cloud-config\npassword: hunter2"]);
    expect(s.digest(data, "inst_a")).toBe(s.digest(data, "inst_a"));
    expect(s.digest(data, "inst_a")).not.toBe(createHash("sha256").update(data).digest("hex"));
    expect(s.digest(data, "inst_a")).not.toBe(s.digest(data, "inst_b"));
    expect(sealer(randomBytes(32).toString("base64")).digest(data, "inst_a")).not.toBe(s.digest(data, "inst_a"));
  });
});
