import { describe, expect, it } from "vitest";
import { z } from "zod";
import { AppError } from "../../contracts/errors.ts";
import { defineProvider } from "../../core/pools/provider/contract.ts";
import { parseConfig } from "../../infra/config.ts";
import { hetznerCloud } from "../../providers/hetzner-cloud/index.ts";

function configError(fn: () => unknown): AppError {
  try {
    fn();
  } catch (e) {
    if (e instanceof AppError) return e;
    throw e;
  }
  throw new Error("expected INVALID_CONFIG");
}

describe("config", () => {
  it("has the spec's defaults", () => {
    const c = parseConfig();
    expect(c.vps.runtimes).toEqual(["libvirt-kvm"]);
    expect(c.vps.hostNetwork).toBe("br0");
    expect(c.vps.providers).toEqual([]);
    expect(c.port).toBe(4000);
  });
  it("reads the environment over the file", () => {
    const c = parseConfig({ port: 5000, vps: { hostNetwork: "br-file" } }, { PORT: "6000", VPS_RUNTIMES: "fake, libvirt-kvm", PROVIDERS: "hetzner-cloud" });
    expect(c.port).toBe(6000);
    expect(c.vps.hostNetwork).toBe("br-file");
    expect(c.vps.runtimes).toEqual(["fake", "libvirt-kvm"]);
    expect(c.vps.providers.map((p) => p.id)).toEqual(["hetzner-cloud"]);
  });
  it.each([
    [{ vps: { runtimes: [] } }, {}, "vps.runtimes"],
    [{ vps: { runtimes: ["Libvirt_KVM"] } }, {}, "vps.runtimes.0"],
    [{ vps: { hostNetwork: "a-name-longer-than-15" } }, {}, "vps.hostNetwork"],
    [{ vps: { hostNetwork: "br 0" } }, {}, "vps.hostNetwork"],
    [{ vps: { hostNetwork: "" } }, {}, "vps.hostNetwork"],
    [{ vps: { providers: [hetznerCloud, hetznerCloud] } }, {}, "vps.providers.1"],
    [{ vps: { providers: [{ id: "x" }] } }, {}, "vps.providers.0"],
    [{}, { PROVIDERS: "nimbus" }, "vps.providers.0"],
    [{}, { PORT: "99999" }, "port"],
    [{}, { DATABASE_URL: "mysql://x" }, "databaseUrl"],
    [{}, { SEAL_KEY: "c2hvcnQ=" }, "sealKey"],
    [{ vps: { images: {} } }, {}, "vps.images"],
    [{}, { LIMIT_ALIASES: "-1" }, "limits.aliases"],
    [{ limits: { cost: 0 } }, {}, "limits.cost"],
    [{}, { LIMIT_API_CONNECTIONS: "0" }, "limits.apiConnections"],
  ] as const)("refuses %j %j at %s", (file, env, path) => {
    const e = configError(() => parseConfig(file as never, env as never));
    expect(e.code).toBe("INVALID_CONFIG");
    expect(e.details.path).toBe(path);
    expect(e.message).toContain(path);
  });
  it("bounds what a request may cost by default, and takes the operator's limits from the file and the environment", () => {
    const d = parseConfig().limits;
    expect(d).toMatchObject({ depth: 10, aliases: 15, tokens: 1000, mutations: 5, cost: 50_000, ratePoints: 600, rateWindowSeconds: 10 });
    const c = parseConfig({ limits: { aliases: 30, mutations: 2 } }, { LIMIT_ALIASES: "40", LIMIT_RATE_POINTS: "0", LIMIT_API_STATEMENT_TIMEOUT_MS: "2500" });
    expect(c.limits).toMatchObject({ aliases: 40, mutations: 2, ratePoints: 0, apiStatementTimeoutMs: 2500, depth: 10 });
  });
  it("accepts a custom provider definition and image resolver", () => {
    const mine = defineProvider({
      id: "my-cloud",
      displayName: "Mine",
      accountConfig: z.object({ region: z.string() }),
      credentials: ["key"],
      connect: () => {
        throw new Error("not called here");
      },
    });
    const images = { resolve: async () => undefined };
    const c = parseConfig({ vps: { providers: [mine], images } });
    expect(c.vps.providers[0]?.id).toBe("my-cloud");
    expect(c.vps.images).toBe(images);
  });
});
