/**
 * Credentials out of error texts. A provider may echo what it was sent — the token as is, or as it was
 * encoded on the way (a header's base64, a form's or a URL's percent-encoding, a log's hex) — and its error
 * text reaches instance conditions, the account's check and the logs. Every spelling is replaced, and so is a
 * spelling's beginning where a message was cut short after it.
 */

export const REDACTED = "[redacted]";

/** Shorter spellings would match ordinary text (and say little of a secret). */
const MIN = 4;
/** A message cut inside a secret leaves its first characters: this many or more are taken for it. */
const MIN_TAIL = 6;

/**
 * The characters of base64 that depend only on the secret's bytes, when it starts `offset` bytes into what
 * was encoded: a secret inside a longer value (`Basic user:secret`, `PVEAPIToken=id=secret`) is spelled one
 * of three ways, whatever surrounds it.
 */
function base64Core(bytes: Buffer, offset: number): string {
  const encoded = Buffer.concat([Buffer.alloc(offset), bytes]).toString("base64");
  return encoded.slice(Math.ceil((offset * 4) / 3), Math.floor(((offset + bytes.length) * 8) / 6));
}

const lowerPercent = (s: string) => s.replace(/%[0-9A-F]{2}/g, (m) => m.toLowerCase());

/** Every spelling of `secret` a provider might echo. */
export function spellings(secret: string): string[] {
  const bytes = Buffer.from(secret, "utf8");
  const base64 = [0, 1, 2].map((offset) => base64Core(bytes, offset));
  const form = new URLSearchParams({ s: secret }).toString().slice(2);
  const all = [
    secret,
    ...base64,
    ...base64.map((b) => b.replace(/\+/g, "-").replace(/\//g, "_")),
    encodeURIComponent(secret),
    encodeURI(secret),
    form,
    ...[encodeURIComponent(secret), encodeURI(secret), form].map(lowerPercent),
    JSON.stringify(secret).slice(1, -1),
    bytes.toString("hex"),
    bytes.toString("hex").toUpperCase(),
  ];
  return [...new Set(all)].filter((s) => s.length >= MIN).sort((a, b) => b.length - a.length);
}

/** A function that takes every spelling of each of `secrets` out of a text. */
export function redactor(secrets: Iterable<string>): (text: string) => string {
  const forms = [...new Set([...secrets].flatMap(spellings))].sort((a, b) => b.length - a.length);
  return (text) => {
    let out = text;
    for (const f of forms) out = out.split(f).join(REDACTED);
    for (const f of forms)
      for (let n = f.length - 1; n >= MIN_TAIL; n--)
        if (out.endsWith(f.slice(0, n))) {
          out = out.slice(0, out.length - n) + REDACTED;
          break;
        }
    return out;
  };
}

/**
 * The error with its texts redacted in place (message, stack, its own string fields such as a provider's
 * reason, and its causes), so it keeps its class and what callers test it for (a ProviderError's kind).
 */
export function scrubError(e: unknown, redact: (text: string) => string): unknown {
  if (typeof e === "string") return redact(e);
  const seen = new Set<unknown>();
  for (let err: unknown = e; err instanceof Error && !seen.has(err); err = err.cause) {
    seen.add(err);
    const fields = err as unknown as Record<string, unknown>;
    for (const key of Object.keys(err)) if (typeof fields[key] === "string") fields[key] = redact(fields[key] as string);
    err.message = redact(err.message);
    if (typeof err.stack === "string") err.stack = redact(err.stack);
  }
  return e;
}
