import { describe, expect, it } from "vitest";
import { isSshPublicKey } from "../../core/instances/ssh.ts";
import { testKey } from "../support/fixtures.ts";

const blob = (type: string, extra = 32) => {
  const t = Buffer.from(type);
  const len = Buffer.alloc(4);
  len.writeUInt32BE(t.length);
  return Buffer.concat([len, t, Buffer.alloc(extra, 7)]).toString("base64");
};

describe("ssh public keys", () => {
  it("accepts well-formed keys, with or without comment", () => {
    expect(isSshPublicKey(testKey())).toBe(true);
    expect(isSshPublicKey(`ssh-ed25519 ${blob("ssh-ed25519")}`)).toBe(true);
    expect(isSshPublicKey(`ecdsa-sha2-nistp256 ${blob("ecdsa-sha2-nistp256", 80)} x`)).toBe(true);
  });
  it("refuses a label that disagrees with the blob, junk, and private keys", () => {
    expect(isSshPublicKey(`ssh-rsa ${blob("ssh-ed25519")}`)).toBe(false);
    expect(isSshPublicKey("ssh-ed25519 AAAA")).toBe(false);
    expect(isSshPublicKey("hello world")).toBe(false);
    expect(isSshPublicKey("-----BEGIN OPENSSH PRIVATE KEY-----")).toBe(false);
    expect(isSshPublicKey(`${testKey()}\nssh-ed25519 ${blob("ssh-ed25519")}`)).toBe(false);
  });
});
