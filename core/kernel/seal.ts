import { createCipheriv, createDecipheriv, createHmac, hkdfSync, randomBytes } from "node:crypto";

/**
 * User data is sealed at rest with AES-256-GCM. The instance id is the associated data, so a sealed blob
 * copied onto another instance row fails to open instead of leaking. Layout: version(1) | iv(12) | tag(16) | ct.
 */
const VERSION = 1;

export interface Sealer {
  seal(plain: string, context: string): Uint8Array<ArrayBuffer>;
  open(sealed: Uint8Array, context: string): string;
  /**
   * A keyed digest (HMAC-SHA256 under a key derived from the seal key): equal inputs compare equal, but
   * without the key a digest confirms no guess of what went in (request hashes cover sealed user data).
   */
  digest(data: string, context: string): string;
}

export function sealer(keyBase64: string): Sealer {
  const key = Buffer.from(keyBase64, "base64");
  if (key.length !== 32) throw new Error("seal key must be 32 bytes");
  // A key of its own for digests: one key is never used for two purposes.
  const digestKey = Buffer.from(hkdfSync("sha256", key, Buffer.alloc(0), "better-compute digest v1", 32));
  return {
    digest(data, context) {
      return createHmac("sha256", digestKey).update(context).update("\u0000").update(data).digest("hex");
    },
    seal(plain, context) {
      const iv = randomBytes(12);
      const cipher = createCipheriv("aes-256-gcm", key, iv);
      cipher.setAAD(Buffer.from(context));
      const ct = Buffer.concat([cipher.update(plain, "utf8"), cipher.final()]);
      return new Uint8Array(Buffer.concat([Buffer.from([VERSION]), iv, cipher.getAuthTag(), ct]));
    },
    open(sealed, context) {
      const buf = Buffer.from(sealed);
      if (buf[0] !== VERSION) throw new Error("unknown sealed-data version");
      const decipher = createDecipheriv("aes-256-gcm", key, buf.subarray(1, 13));
      decipher.setAAD(Buffer.from(context));
      decipher.setAuthTag(buf.subarray(13, 29));
      return Buffer.concat([decipher.update(buf.subarray(29)), decipher.final()]).toString("utf8");
    },
  };
}

/** A new sealing key: 32 random bytes, base64. */
export const newSealKey = () => randomBytes(32).toString("base64");
