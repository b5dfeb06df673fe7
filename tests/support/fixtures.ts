/** A syntactically real OpenSSH ed25519 public key (the blob names its type), for requests that need one. */
export function testKey(comment = "me@laptop", seed = 7): string {
  const type = Buffer.from("ssh-ed25519");
  const len = Buffer.alloc(4);
  len.writeUInt32BE(type.length);
  return `ssh-ed25519 ${Buffer.concat([len, type, Buffer.alloc(32, seed)]).toString("base64")} ${comment}`;
}

export const sha256Of = (c: string) => c.repeat(64).slice(0, 64);

/** Wait until `check` holds, polling; throws after `timeoutMs`. For setup code, where expect.poll is not allowed. */
export async function until(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 15_000, intervalMs = 50): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** A small seeded PRNG (mulberry32): the same seed gives the same churn. */
export function prng(seed: number) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
