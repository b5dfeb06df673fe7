/** A syntactically real OpenSSH ed25519 public key (the blob names its type), for requests that need one. */
export function testKey(comment = "me@laptop", seed = 7): string {
  const type = Buffer.from("ssh-ed25519");
  const len = Buffer.alloc(4);
  len.writeUInt32BE(type.length);
  return `ssh-ed25519 ${Buffer.concat([len, type, Buffer.alloc(32, seed)]).toString("base64")} ${comment}`;
}

export const sha256Of = (c: string) => c.repeat(64).slice(0, 64);
