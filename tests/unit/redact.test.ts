import { describe, expect, it } from "vitest";
import { ProviderError } from "../../core/pools/provider/contract.ts";
import { REDACTED, redactor, scrubError } from "../../infra/redact.ts";

// Characters each encoding treats differently: base64's + and /, what percent- and form-encoding escape.
const secret = "tok3n+/=&?:@~!*'()[]{}$,;#%-_.Z9";
const redact = redactor([secret]);
const bytes = Buffer.from(secret);

/** Each way a provider might echo the secret, as the provider would write it (not as redact.ts computes it). */
const echoes: Record<string, string> = {
  raw: secret,
  base64: bytes.toString("base64"),
  base64url: bytes.toString("base64url"),
  "base64 of the header": Buffer.from(`Bearer ${secret}`).toString("base64"),
  "base64 of user:secret": Buffer.from(`u:${secret}`).toString("base64"),
  "base64 at offset 2": Buffer.from(`ab${secret}`).toString("base64url"),
  "PVE header, base64": Buffer.from(`PVEAPIToken=root@pam!bc=${secret}`).toString("base64"),
  encodeURIComponent: encodeURIComponent(secret),
  encodeURI: encodeURI(secret),
  form: new URLSearchParams({ token: secret }).toString(),
  "form, lower-case escapes": new URLSearchParams({ token: secret }).toString().replace(/%[0-9A-F]{2}/g, (m) => m.toLowerCase()),
  json: JSON.stringify({ token: secret }),
  hex: bytes.toString("hex"),
  HEX: bytes.toString("hex").toUpperCase(),
};

/** The parts of an echo only the secret decides (base64 of a longer value starts and ends with its neighbours). */
const telltales = (echo: string) => [echo.slice(12, -4), bytes.toString("hex").slice(4, 20), bytes.toString("base64").slice(4, 20)];

describe("redaction of credentials from provider error texts", () => {
  it.each(Object.entries(echoes))("takes out the secret echoed as %s", (_how, echo) => {
    const text = `invalid_input (400): you sent "${echo}" which is wrong`;
    const out = redact(text);
    expect(out).toContain(REDACTED);
    expect(out.startsWith("invalid_input (400): you sent")).toBe(true);
    expect(out.endsWith("which is wrong")).toBe(true);
    for (const part of telltales(echo)) if (part.length >= 8) expect(out).not.toContain(part);
  });

  it("takes out a secret's beginning where the message was cut inside it", () => {
    const hex = bytes.toString("hex");
    const out = redact(`failed: header was ${hex.slice(0, 23)}`);
    expect(out).toBe(`failed: header was ${REDACTED}`);
    expect(redact(`cut in base64: ${bytes.toString("base64").slice(0, 10)}`)).toBe(`cut in base64: ${REDACTED}`);
  });

  it("leaves ordinary text alone, and every credential of a session is taken out", () => {
    expect(redact("hetzner-cloud: GET /servers failed: unauthorized (401): unable to authenticate")).toBe(
      "hetzner-cloud: GET /servers failed: unauthorized (401): unable to authenticate",
    );
    const two = redactor(["first-secret-value", "second-secret-value"]);
    const out = two(`a first-secret-value and a ${Buffer.from("second-secret-value").toString("base64")} b`);
    expect(out.startsWith(`a ${REDACTED} and a ${REDACTED}`)).toBe(true);
    expect(out).not.toContain("c2Vjb25kLXNlY3JldC12YWx1");
  });

  it("scrubs an error in place: its class, kind and code stay, its message, stack, fields and causes lose the secret", () => {
    const cause = new Error(`socket said ${encodeURIComponent(secret)}`);
    const e = Object.assign(new ProviderError("auth", `refused ${secret}`, { code: "unauthorized" }), { reason: `reason ${bytes.toString("hex")}` });
    (e as { cause?: unknown }).cause = cause;
    const out = scrubError(e, redact);
    expect(out).toBe(e);
    expect(e).toBeInstanceOf(ProviderError);
    expect([e.kind, e.code]).toEqual(["auth", "unauthorized"]);
    expect(e.message).toBe(`refused ${REDACTED}`);
    expect(e.reason).toBe(`reason ${REDACTED}`);
    expect(String(e.stack)).not.toContain(secret);
    expect(cause.message).toBe(`socket said ${REDACTED}`);
    expect(scrubError(`string ${secret}`, redact)).toBe(`string ${REDACTED}`);
  });
});
