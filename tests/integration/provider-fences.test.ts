import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateFlavorDocument, CreatePoolDocument, CreateProviderAccountDocument } from "../../sdk/client.ts";
import { startWorker } from "../../worker/index.ts";
import { until } from "../support/fixtures.ts";
import { expectCode, type Harness, startHarness } from "../support/harness.ts";
import { createProviderInstance, instanceOf } from "../support/providers.ts";

/**
 * Issue 42, "Secret references and endpoints are fenced": through the API and the real worker, against a real
 * HTTP server standing in for a provider that records every request (and the credential it carried) and, when
 * told, echoes the credential back in an error in some encoding.
 */

const root = mkdtempSync(join(tmpdir(), "bc-fences-"));
const elsewhere = mkdtempSync(join(tmpdir(), "bc-fences-out-"));
const dataDir = join(root, "data");
const secretsDir = join(root, "secrets");
const sealKeyFile = join(dataDir, "seal.key");
const sealKeyValue = `seal-${randomBytes(16).toString("hex")}`;
const databaseUrl = `postgresql://bc:pw-${randomBytes(8).toString("hex")}@db.internal/bc`;
const outsideValue = `outside-${randomBytes(8).toString("hex")}`;
const token = `tok-${randomBytes(6).toString("hex")}+/=&?:@~!*'()`;

/** The provider's stand-in: every request recorded by the path's first segment (one per account). */
const requests: { tag: string; authorization: string }[] = [];
/** A tag's echo: how the error it answers spells the credential it was sent. */
const echoes = new Map<string, (credential: string) => string>();
let provider: Server;
let base = "";

function serve(): Server {
  return createServer((req, res) => {
    const [, tag = "", ...rest] = (req.url ?? "").split("/");
    const authorization = req.headers.authorization ?? "";
    requests.push({ tag, authorization });
    const json = (status: number, body: unknown) => res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
    if (rest.join("/").startsWith("v1/server_types"))
      return json(200, { server_types: [{ name: "cx22", cores: 2, memory: 4, disk: 40 }], meta: { pagination: { next_page: null } } });
    const echo = echoes.get(tag);
    if (!echo) return json(401, { error: { code: "unauthorized", message: "unable to authenticate" } });
    json(400, { error: { code: "invalid_input", message: echo(authorization.replace(/^Bearer /, "")) } });
  });
}

beforeAll(async () => {
  mkdirSync(dataDir);
  mkdirSync(secretsDir);
  writeFileSync(sealKeyFile, sealKeyValue);
  writeFileSync(join(secretsDir, "token"), token);
  writeFileSync(join(elsewhere, "secret"), outsideValue);
  symlinkSync(join(elsewhere, "secret"), join(secretsDir, "escape"));
  symlinkSync(sealKeyFile, join(secretsDir, "seal"));
  provider = serve();
  await new Promise<void>((r) => provider.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${(provider.address() as AddressInfo).port}`;
});
afterAll(async () => {
  provider?.closeAllConnections();
  await new Promise((r) => provider?.close(r));
  rmSync(root, { recursive: true, force: true });
  rmSync(elsewhere, { recursive: true, force: true });
});

/** A harness with its worker; `env` over the tests' allowances ("" restores a default). */
async function deployment(env: Record<string, string>) {
  const h = await startHarness({ PROVIDERS: "hetzner-cloud,proxmox-ve", PROVIDER_SWEEP_MS: "200", BC_DATA_DIR: dataDir, ...env });
  const worker = await startWorker(h.platform);
  const close = async () => {
    await worker.close();
    await h.close();
  };
  return { h, close };
}

const tagged = (prefix: string) => `${prefix}${randomBytes(3).toString("hex")}`;
const count = (h: Harness, table: string) => h.platform.read(async (sql) => (await sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`))[0]?.n);
const offersOf = (h: Harness, id: string) =>
  h.platform.read(async (sql) => (await sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM provider_offers WHERE account_id = $1`, [id]))[0]?.n ?? 0);
const checkOf = (h: Harness, id: string) =>
  h.platform.read(
    async (sql) =>
      (
        await sql.query<{ error: string | null; kind: string | null }>(
          `SELECT check_error AS error, check_error_kind AS kind FROM provider_accounts WHERE id = $1`,
          [id],
        )
      )[0],
  );

/** An account row as one stored before the fence would be: straight into the table. */
async function storedAccount(h: Harness, config: object, credentials: object): Promise<string> {
  const id = `pacc_${randomBytes(8).toString("hex")}`;
  await h.platform.write({ actor: "test" }, (w) =>
    w.sql.query(
      `INSERT INTO provider_accounts (id, name, provider, config, credentials, created_at) VALUES ($1, $1, 'hetzner-cloud', $2::jsonb, $3::jsonb, now())`,
      [id, JSON.stringify(config), JSON.stringify(credentials)],
    ),
  );
  return id;
}

async function checked(h: Harness, id: string) {
  await until("the provider sweep to record the account's check", async () => (await checkOf(h, id))?.error != null);
  return (await checkOf(h, id)) as { error: string; kind: string };
}

describe("provider accounts under a deployment's defaults", () => {
  let d: Awaited<ReturnType<typeof deployment>>;
  beforeAll(async () => {
    // Every allowance the tests' harness gives is taken back; the secrets directory is the data dir's parent.
    d = await deployment({ PROVIDER_ENDPOINT_HTTP: "", PROVIDER_ENDPOINT_ALLOW: "", PROVIDER_SECRET_ENV_PREFIX: "", PROVIDER_SECRET_DIR: root });
  });
  afterAll(() => d?.close());

  const create = (credentials: Record<string, unknown>, config: Record<string, unknown> = {}, provider = "hetzner-cloud") =>
    d.h.operator.request(CreateProviderAccountDocument, { input: { name: tagged("a-"), provider, config, credentials } });

  it.each([
    ["env:DATABASE_URL"],
    ["env:HOME"],
    [`file:${sealKeyFile}`],
    [`file:${join(secretsDir, "seal")}`],
    [`file:${join(secretsDir, "escape")}`],
    [`file:${secretsDir}/../data/seal.key`],
    [`file:${join(elsewhere, "secret")}`],
  ])("refuses the credential reference %s as INVALID_INPUT, naming the credential and not the reference, writing nothing", async (ref) => {
    const [accounts, audits] = [await count(d.h, "provider_accounts"), await count(d.h, "audit_log")];
    const e = await expectCode(create({ token: ref }), "INVALID_INPUT");
    expect(e.message).toMatch(/^INVALID_INPUT: input\.credentials\.token: /);
    expect(e.message).not.toContain(ref.slice(ref.indexOf(":") + 1));
    expect([await count(d.h, "provider_accounts"), await count(d.h, "audit_log")]).toEqual([accounts, audits]);
  });

  it("takes references inside the fence", async () => {
    // An endpoint no name server knows: nothing leaves the machine when the worker looks.
    const config = { endpoint: "https://api.invalid/v1" };
    const { createProviderAccount } = await create({ token: `file:${join(secretsDir, "token")}` }, config);
    expect(createProviderAccount.credentials).toEqual({ token: `file:${join(secretsDir, "token")}` });
    await create({ token: "env:BC_SECRET_HCLOUD_TOKEN" }, config);
  });

  it.each([
    ["hetzner-cloud", "http://127.0.0.1:<port>/v1"],
    ["hetzner-cloud", "https://127.0.0.1:<port>/v1"],
    ["hetzner-cloud", "https://169.254.169.254/v1"],
    ["proxmox-ve", "https://[::1]:8006/api2/json"],
    ["proxmox-ve", "https://10.0.0.5:8006/api2/json"],
  ])("refuses a %s endpoint %s as INVALID_INPUT, and nothing reaches it", async (provider, at) => {
    const before = requests.length;
    const endpoint = at.replace("<port>", new URL(base).port);
    const config = provider === "proxmox-ve" ? { endpoint, tokenId: "root@pam!bc", node: "pve", templates: { "debian-12": 9000 } } : { endpoint };
    const credentials = provider === "proxmox-ve" ? { tokenSecret: { value: token } } : { token: { value: token } };
    const e = await expectCode(create(credentials, config, provider), "INVALID_INPUT");
    expect(e.message).toMatch(/^INVALID_INPUT: input\.config\.endpoint: /);
    expect(requests.length).toBe(before);
  });
});

describe("provider calls where plain http is allowed, and no private address", () => {
  let d: Awaited<ReturnType<typeof deployment>>;
  beforeAll(async () => {
    d = await deployment({ PROVIDER_ENDPOINT_ALLOW: "" });
  });
  afterAll(() => d?.close());

  it("refuses a name that resolves to loopback after DNS, at call time, and sends nothing", async () => {
    const tag = tagged("dns");
    const { createProviderAccount } = await d.h.operator.request(CreateProviderAccountDocument, {
      input: {
        name: tag,
        provider: "hetzner-cloud",
        config: { endpoint: `${base.replace("127.0.0.1", "localhost")}/${tag}/v1` },
        credentials: { token: { value: token } },
      },
    });
    const check = await checked(d.h, createProviderAccount.id);
    expect(check.kind).toBe("invalid");
    expect(check.error).toMatch(/localhost refused: it resolves to a loopback address/);
    expect(requests.filter((r) => r.tag === tag)).toEqual([]);
  });

  it("refuses an address literal stored before the rule, at call time, and sends nothing", async () => {
    const tag = tagged("old");
    process.env.BC_SECRET_OLD_ROW = token;
    const id = await storedAccount(d.h, { endpoint: `${base}/${tag}/v1` }, { token: "env:BC_SECRET_OLD_ROW" });
    const check = await checked(d.h, id);
    expect([check.kind, check.error]).toEqual(["invalid", expect.stringMatching(/127\.0\.0\.1 refused: names a loopback address/)]);
    expect(requests.filter((r) => r.tag === tag)).toEqual([]);
  });
});

describe("provider calls where the operator allowed the provider's address", () => {
  let d: Awaited<ReturnType<typeof deployment>>;
  beforeAll(async () => {
    process.env.DATABASE_URL = databaseUrl;
    d = await deployment({ PROVIDER_SECRET_ENV_PREFIX: "", PROVIDER_SECRET_DIR: secretsDir });
  });
  afterAll(async () => {
    delete process.env.DATABASE_URL;
    await d?.close();
  });

  it.each([
    ["env:DATABASE_URL", databaseUrl],
    [`file:${sealKeyFile}`, sealKeyValue],
    [`file:${join(secretsDir, "seal")}`, sealKeyValue],
    [`file:${join(secretsDir, "escape")}`, outsideValue],
  ])("refuses %s stored before the rule when the broker resolves it: auth, without the value, nothing sent", async (ref, value) => {
    const tag = tagged("ref");
    const id = await storedAccount(d.h, { endpoint: `${base}/${tag}/v1` }, { token: ref });
    const check = await checked(d.h, id);
    expect(check.kind).toBe("auth");
    expect(check.error).toMatch(/reference refused/);
    expect(check.error).not.toContain(value);
    expect(check.error).not.toContain(ref.slice(ref.indexOf(":") + 1));
    expect(requests.filter((r) => r.tag === tag)).toEqual([]);
    expect(requests.some((r) => r.authorization.includes(value))).toBe(false);
  });

  const bytes = Buffer.from(token);
  const spelled: Record<string, (t: string) => string> = {
    raw: (t) => t,
    base64: (t) => Buffer.from(t).toString("base64"),
    "base64 of the header": (t) => Buffer.from(`Bearer ${t}`).toString("base64"),
    base64url: (t) => Buffer.from(t).toString("base64url"),
    encodeURIComponent: (t) => encodeURIComponent(t),
    form: (t) => new URLSearchParams({ token: t }).toString(),
    hex: (t) => Buffer.from(t).toString("hex"),
    HEX: (t) => Buffer.from(t).toString("hex").toUpperCase(),
    "hex, cut short": (t) => `${"-".repeat(260)}${Buffer.from(t).toString("hex")}`,
  };
  /** What must not be left of the token: each spelling, the token-only part of the header's, a long head of the hex. */
  const leftovers = [
    ...Object.entries(spelled)
      .filter(([how]) => how !== "hex, cut short")
      .map(([, f]) => f(token)),
    Buffer.from(`Bearer ${token}`).toString("base64").slice(12, -4),
    bytes.toString("hex").slice(0, 16),
    bytes.toString("base64").slice(0, 16),
  ];

  it.each(Object.keys(spelled))("keeps the credential echoed as %s out of the error, the account's check and the instance's condition", async (how) => {
    const tag = tagged("echo");
    echoes.set(tag, (t) => `you sent ${spelled[how]?.(t)}`);
    const { createProviderAccount } = await d.h.operator.request(CreateProviderAccountDocument, {
      input: { name: tag, provider: "hetzner-cloud", config: { endpoint: `${base}/${tag}/v1` }, credentials: { token: { value: token } } },
    });
    const accountId = createProviderAccount.id;
    // The call's own error, from the worker's session.
    const session = await d.h.platform.sync.providers.session(accountId);
    const error = await session.list().then(
      () => "",
      (e: Error) => e.message,
    );
    const check = await checked(d.h, accountId);
    const { createPool } = await d.h.operator.request(CreatePoolDocument, { input: { name: tag, class: "PROVIDER", providerAccountId: accountId } });
    await d.h.operator.request(CreateFlavorDocument, { input: { poolId: createPool.id, name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10, gpus: null } });
    await until("the offers to be read", async () => (await offersOf(d.h, accountId)) > 0);
    const t = await d.h.tenant();
    const inst = await createProviderInstance(t.client, { accountId, poolId: createPool.id, image: "debian-12" });
    const conditionOf = async () => (await instanceOf(t.client, inst.id)).conditions.find((c) => c.type === "ProviderError")?.message;
    await until("the provider's refusal on the instance", async () => (await conditionOf()) !== undefined);
    const condition = (await conditionOf()) as string;
    for (const text of [error, check.error, condition]) {
      expect(text).toContain("invalid_input");
      expect(text).toContain("[redacted]");
      for (const leftover of leftovers) expect(text).not.toContain(leftover);
    }
    expect(requests.filter((r) => r.tag === tag).every((r) => r.authorization === `Bearer ${token}`)).toBe(true);
  });
});
