import { z } from "zod";

const keyTypes = new Set([
  "ssh-ed25519",
  "ssh-rsa",
  "ecdsa-sha2-nistp256",
  "ecdsa-sha2-nistp384",
  "ecdsa-sha2-nistp521",
  "sk-ssh-ed25519@openssh.com",
  "sk-ecdsa-sha2-nistp256@openssh.com",
]);

/**
 * An OpenSSH public key line: `type base64 [comment]`. The blob must decode and name the same type it is
 * labelled with, which catches truncated and pasted-wrong keys before they reach a guest.
 */
export function isSshPublicKey(line: string): boolean {
  const m = /^(\S+) ([A-Za-z0-9+/]+={0,2})(?: [^\r\n]*)?$/.exec(line.trim());
  if (!m || !keyTypes.has(m[1] as string)) return false;
  const blob = Buffer.from(m[2] as string, "base64");
  if (blob.length < 8) return false;
  const len = blob.readUInt32BE(0);
  return len + 4 <= blob.length && blob.subarray(4, 4 + len).toString() === m[1];
}

export const sshPublicKey = z
  .string()
  .max(16 * 1024)
  .refine(isSshPublicKey, "not an OpenSSH public key")
  .transform((s) => s.trim());
