import { readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import { loadAgentConfig } from "../../agent/config.ts";
import { isAppError } from "../../contracts/errors.ts";

const server = ["--server", "http://127.0.0.1:4000/graphql"];
const load = (argv: string[], env: Record<string, string | undefined> = {}) => loadAgentConfig(argv, env, "Build_Host.example");

/** The INVALID_CONFIG message `load` throws. */
function refusal(argv: string[], env: Record<string, string | undefined> = {}): string {
  try {
    load(argv, env);
  } catch (e) {
    if (isAppError(e, "INVALID_CONFIG")) return e.message;
    throw e;
  }
  throw new Error(`accepted ${argv.join(" ")}`);
}

describe("agent configuration", () => {
  const saved = process.env.LOG_LEVEL;
  afterEach(() => {
    if (saved === undefined) delete process.env.LOG_LEVEL;
    else process.env.LOG_LEVEL = saved;
  });

  it("has the defaults bc agent always had, and reads only the environment it is given", () => {
    process.env.LOG_LEVEL = "loud"; // not passed in, so not read
    expect(load(server)).toEqual({
      server: "http://127.0.0.1:4000/graphql",
      joinToken: undefined,
      name: "build-host.example",
      stateDir: resolve(".data/agent/build-host.example"),
      runtime: "fake",
      heartbeatMs: 5000,
      egress: "off",
      logLevel: "info",
      runtimeOptions: {
        stateDir: resolve(".data/agent/build-host.example"),
        capacity: { vcpus: 16, memoryMib: 65536, diskGib: 1000, gpus: [] },
        delayMs: 0,
        libvirt: {
          uri: undefined,
          domainType: "auto",
          boot: undefined,
          shutdownTimeoutMs: undefined,
          gpus: [],
          imageSources: { allow: [], allowHttp: false },
        },
      },
    });
  });

  it("takes every flag", () => {
    const c = load([
      ...server,
      "--join-token=jt_abc",
      "--runtime",
      "libvirt-kvm",
      "--name",
      "box-1",
      "--state-dir",
      "/var/lib/bc-agent",
      "--heartbeat-ms",
      "300",
      "--vcpus",
      "8",
      "--memory-mib",
      "4096",
      "--disk-gib",
      "50",
      "--delay-ms",
      "20",
      "--libvirt-uri",
      "qemu+ssh://root@host/system",
      "--domain-type",
      "qemu",
      "--kernel",
      "/boot/vmlinuz",
      "--initrd",
      "/boot/initrd.img",
      "--cmdline",
      "console=ttyS0",
      "--shutdown-timeout-ms",
      "0",
      "--gpu",
      "L4=0000:65:00.0",
      "--gpu",
      "L4=0000:66:00.0",
      "--image-source-allow",
      "10.20.0.0/16",
      "--image-source-allow=fd00::/8",
      "--image-source-http",
    ]);
    expect(c).toMatchObject({ joinToken: "jt_abc", runtime: "libvirt-kvm", name: "box-1", stateDir: "/var/lib/bc-agent", heartbeatMs: 300 });
    expect(c.runtimeOptions).toEqual({
      stateDir: "/var/lib/bc-agent",
      capacity: { vcpus: 8, memoryMib: 4096, diskGib: 50, gpus: [] },
      delayMs: 20,
      libvirt: {
        uri: "qemu+ssh://root@host/system",
        domainType: "qemu",
        boot: { kernel: "/boot/vmlinuz", initrd: "/boot/initrd.img", cmdline: "console=ttyS0" },
        shutdownTimeoutMs: 0,
        gpus: [
          { model: "L4", pciAddress: "0000:65:00.0" },
          { model: "L4", pciAddress: "0000:66:00.0" },
        ],
        imageSources: { allow: ["10.20.0.0/16", "fd00::/8"], allowHttp: true },
      },
    });
  });

  it("refuses a number that is not one, naming the flag and the value", () => {
    expect(refusal([...server, "--heartbeat-ms", "abc"])).toBe('--heartbeat-ms: expected an integer of at least 100, got "abc"');
    expect(refusal([...server, "--heartbeat-ms", "50"])).toBe('--heartbeat-ms: expected an integer of at least 100, got "50"');
    expect(refusal([...server, "--heartbeat-ms", "1e3"])).toMatch(/^--heartbeat-ms: /);
    expect(refusal([...server, "--vcpus", "2.5"])).toBe('--vcpus: expected an integer of at least 1, got "2.5"');
    expect(refusal([...server, "--delay-ms=-5"])).toBe('--delay-ms: expected an integer of at least 0, got "-5"');
    expect(refusal([...server, "--shutdown-timeout-ms", ""])).toMatch(/^--shutdown-timeout-ms: expected an integer/);
  });

  it("refuses unknown flags, stray arguments and flags without their value", () => {
    expect(refusal([...server, "--vcpu", "4"])).toMatch(/--vcpu\b/);
    expect(refusal([...server, "extra"])).toMatch(/extra/);
    expect(refusal(["--server"])).toMatch(/--server/);
  });

  it("refuses what the agent could not use, naming the flag", () => {
    expect(refusal([])).toBe("--server: required");
    expect(refusal(["--server", "ftp://example.org"])).toBe('--server: expected an http:// or https:// URL, got "ftp://example.org"');
    expect(refusal([...server, "--runtime", "xen"])).toBe('--runtime: expected one of fake, libvirt-kvm, got "xen"');
    expect(refusal([...server, "--name", "Box_1"])).toMatch(/^--name: expected 1 to 63 lower-case letters.*got "Box_1"$/);
    expect(refusal([...server, "--domain-type", "kvmx"])).toBe('--domain-type: expected one of auto, kvm, qemu, got "kvmx"');
    expect(refusal([...server, "--gpu", "L4=0000:65:00.0", "--gpu", "L4"])).toBe('--gpu: expected model=0000:65:00.0, got "L4"');
    expect(refusal([...server, "--libvirt-uri", "system"])).toMatch(/^--libvirt-uri: expected a libvirt URI/);
    expect(refusal([...server, "--initrd", "/boot/initrd.img"])).toBe("--initrd: only with --kernel");
    expect(refusal([...server, "--image-source-allow", "10.0.0.0/8", "--image-source-allow", "localhost"])).toBe(
      '--image-source-allow: expected a CIDR such as 10.0.0.0/8 or fd00::/8, or an address, got "localhost"',
    );
  });

  it("reads the image-source allowances from IMAGE_SOURCE_ALLOW and IMAGE_SOURCE_HTTP, with flags over the environment", () => {
    const env = { IMAGE_SOURCE_ALLOW: "127.0.0.0/8, ::1", IMAGE_SOURCE_HTTP: "true" };
    expect(load(server, env).runtimeOptions.libvirt?.imageSources).toEqual({ allow: ["127.0.0.0/8", "::1"], allowHttp: true });
    expect(load([...server, "--image-source-allow", "192.168.7.0/24"], env).runtimeOptions.libvirt?.imageSources).toEqual({
      allow: ["192.168.7.0/24"],
      allowHttp: true,
    });
    expect(load(server, { IMAGE_SOURCE_HTTP: "false" }).runtimeOptions.libvirt?.imageSources).toEqual({ allow: [], allowHttp: false });
    expect(refusal(server, { IMAGE_SOURCE_ALLOW: "127.0.0.0/8,10.0.0.0/40" })).toMatch(/^IMAGE_SOURCE_ALLOW: expected a CIDR/);
    expect(refusal(server, { IMAGE_SOURCE_HTTP: "maybe" })).toBe('IMAGE_SOURCE_HTTP: expected true or false, got "maybe"');
  });

  it("reads LOG_LEVEL, LIBVIRT_DOMAIN_TYPE and LIBVIRT_URI, with flags over the environment", () => {
    const env = { LOG_LEVEL: "warn", LIBVIRT_DOMAIN_TYPE: "qemu", LIBVIRT_URI: "qemu:///session" };
    expect(load(server, env)).toMatchObject({ logLevel: "warn", runtimeOptions: { libvirt: { domainType: "qemu", uri: "qemu:///session" } } });
    expect(load([...server, "--domain-type", "kvm", "--libvirt-uri", "qemu:///system"], env).runtimeOptions.libvirt).toMatchObject({
      domainType: "kvm",
      uri: "qemu:///system",
    });
    expect(load(server, { LOG_LEVEL: "" }).logLevel).toBe("info"); // empty is unset
    expect(refusal(server, { LOG_LEVEL: "loud" })).toBe('LOG_LEVEL: expected one of debug, info, warn, error, silent, got "loud"');
    expect(refusal(server, { LIBVIRT_DOMAIN_TYPE: "xen" })).toBe('LIBVIRT_DOMAIN_TYPE: expected one of auto, kvm, qemu, got "xen"');
    expect(refusal(server, { LIBVIRT_URI: "nope" })).toMatch(/^LIBVIRT_URI: expected a libvirt URI/);
  });

  it("bc agent loads nothing of the server: from cli/agent.ts only agent/, contracts/, sdk/ and infra/log.ts are reachable", () => {
    const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
    const seen = new Set<string>();
    const visit = (file: string) => {
      if (seen.has(file)) return;
      seen.add(file);
      const source = readFileSync(file, "utf8");
      for (const m of source.matchAll(/(?:from|import\()\s*["'](\.{1,2}\/[^"']+)["']/g)) visit(join(dirname(file), m[1] as string));
    };
    visit(join(repo, "cli/agent.ts"));
    const outside = [...seen].map((f) => relative(repo, f)).filter((f) => !/^(agent|contracts|sdk)\//.test(f) && f !== "infra/log.ts" && f !== "cli/agent.ts");
    expect(outside).toEqual([]);
    expect(seen.size).toBeGreaterThan(5);
  });
});
