import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { newSealKey, sealer } from "../../core/kernel/seal.ts";
import { defineProvider, isProviderError, type ProviderContext } from "../../core/pools/provider/contract.ts";
import { providerSessions, secretBroker } from "../../infra/providers.ts";

const seal = sealer(newSealKey());
const dir = mkdtempSync(join(tmpdir(), "bc-secrets-"));
// The fence: test variables, and files in the temporary directory (docs/architecture.md, Accounts and secrets).
const refs = { envPrefix: "BC_TEST_", dir, dataDir: join(dir, "no-data-dir") };
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const failure = async (p: Promise<unknown>) => {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error("expected a failure");
};

describe("the secret broker", () => {
  const resolve = secretBroker({ sealer: seal, refs });

  it("resolves file: (without its trailing newline) and sealed: bound to the account and credential", async () => {
    const file = join(dir, "token");
    writeFileSync(file, "from-a-file\n");
    expect(await resolve("pacc_1", "token", `file:${file}`)).toBe("from-a-file");
    const sealed = `sealed:${Buffer.from(seal.seal("sealed-value", "pacc_1/token")).toString("base64")}`;
    expect(await resolve("pacc_1", "token", sealed)).toBe("sealed-value");
    // Copied onto another account, a sealed value does not open.
    const e = await failure(resolve("pacc_2", "token", sealed));
    expect(isProviderError(e) && e.kind).toBe("auth");
  });

  it("fails as auth, naming the reference and never a value", async () => {
    for (const ref of ["env:BC_TEST_SURELY_UNSET_VARIABLE", `file:${join(dir, "missing")}`, "vault:kv/x"]) {
      const e = await failure(resolve("pacc_1", "token", ref));
      expect(isProviderError(e) && e.kind).toBe("auth");
      expect((e as Error).message).toContain("pacc_1");
    }
  });

  it("takes a deployment's own resolver first", async () => {
    const custom = secretBroker({ sealer: seal, refs, custom: { resolve: async (ref) => (ref.startsWith("vault:") ? "from-vault" : undefined) } });
    expect(await custom("pacc_1", "token", "vault:kv/x")).toBe("from-vault");
  });
});

describe("provider sessions", () => {
  it("resolve a credential when a call needs it, and again after the TTL (rotation)", async () => {
    const file = join(dir, "rotating");
    writeFileSync(file, "first");
    let ctx: ProviderContext | undefined;
    const probe = defineProvider({
      id: "probe",
      displayName: "Probe",
      accountConfig: z.object({}),
      credentials: ["key"],
      connect: (_c, context) => {
        ctx = context;
        return {} as never;
      },
    });
    const account = { id: "pacc_1", name: "a", provider: "probe", config: {}, credentials: { key: `file:${file}` }, createdAt: new Date() };
    let ttl = 60_000;
    const sessions = providerSessions({
      read: async (fn) => fn({ query: async () => [account] } as never),
      providers: [probe],
      sealer: seal,
      refs,
      endpoints: { allow: [], allowHttp: false },
      managedBy: "bc-test",
      get credentialTtlMs() {
        return ttl;
      },
    });
    await sessions.session("pacc_1");
    expect(await ctx?.credential("key")).toBe("first");
    writeFileSync(file, "second");
    expect(await ctx?.credential("key")).toBe("first");
    ttl = 0;
    expect(await ctx?.credential("key")).toBe("second");
    expect(ctx?.managedBy).toBe("bc-test");
  });
});
