import { createHash, randomBytes } from "node:crypto";

// RFC 4648 base32, lower case: ids survive case-insensitive places (DNS labels, file systems) and read well.
const alphabet = "abcdefghijklmnopqrstuvwxyz234567";

export function base32(bytes: Uint8Array): string {
  let out = "";
  let bits = 0;
  let value = 0;
  for (const byte of bytes) {
    value = (value << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += alphabet[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += alphabet[(value << (5 - bits)) & 31];
  return out;
}

export type IdKind =
  | "ten"
  | "idn"
  | "tok"
  | "prj"
  | "pool"
  | "ipp"
  | "node"
  | "gpu"
  | "alloc"
  | "flv"
  | "img"
  | "pacc"
  | "join"
  | "cmd"
  | "snap"
  | "stpl"
  | "sbx"
  | "mspan";

/** Random ids: a kind prefix and 128 bits. Tests may swap the source for a deterministic one. */
export type IdSource = (kind: IdKind) => string;
export const randomIds: IdSource = (kind) => `${kind}_${base32(random16())}`;

// Drawn from the CSPRNG a block at a time, as crypto.randomUUID does: each draw is a call into OpenSSL that
// costs more than the id made of it, and a create makes several.
let block = Buffer.alloc(0);
let used = 0;
function random16(): Buffer {
  if (used + 16 > block.length) {
    block = randomBytes(4096);
    used = 0;
  }
  used += 16;
  return block.subarray(used - 16, used);
}

/**
 * The instance id is a pure function of who asked and their idempotency key, so a replayed create lands on
 * the same primary key: the database, not a cache, is what makes creates idempotent. 32 bytes → 52 chars.
 */
export function instanceId(tenantId: string, callerId: string, idempotencyKey: string): string {
  return derivedId("inst", [tenantId, callerId, idempotencyKey]);
}

/** An id that is a pure function of `parts` (SHA-256, base32, `chars` long): how idempotent creates find their row. */
export function derivedId(prefix: string, parts: readonly string[], chars = 52): string {
  return `${prefix}_${base32(createHash("sha256").update(JSON.stringify(parts)).digest()).slice(0, chars)}`;
}

export const sha256Hex = (data: string | Uint8Array) => createHash("sha256").update(data).digest("hex");
