import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseConfig, settingNames } from "../../infra/config.ts";
import { RefusedReference, readFenced, refusal, type SecretRefPolicy } from "../../infra/secret-refs.ts";

// root/secrets is the secrets directory; root/data the data dir; elsewhere is outside both.
const root = mkdtempSync(join(tmpdir(), "bc-refs-"));
const elsewhere = mkdtempSync(join(tmpdir(), "bc-refs-out-"));
const secrets = join(root, "secrets");
const data = join(root, "data");
mkdirSync(secrets);
mkdirSync(data);
writeFileSync(join(secrets, "token"), "in-the-fence\n");
writeFileSync(join(data, "seal.key"), "the-seal-key");
writeFileSync(join(elsewhere, "passwd"), "outside");
symlinkSync(join(elsewhere, "passwd"), join(secrets, "escape"));
symlinkSync(join(secrets, "token"), join(secrets, "alias"));
mkdirSync(join(secrets, "sub"));
writeFileSync(join(secrets, "big"), "x".repeat(70_000));
afterAll(() => {
  rmSync(root, { recursive: true, force: true });
  rmSync(elsewhere, { recursive: true, force: true });
});

const fence: SecretRefPolicy = { envPrefix: "BC_SECRET_", dir: secrets, dataDir: data };

const readError = async (path: string, p = fence) => {
  try {
    await readFenced(path, p);
  } catch (e) {
    expect(e).toBeInstanceOf(RefusedReference);
    return e as RefusedReference;
  }
  throw new Error(`${path} was read`);
};

describe("the fence around credential references", () => {
  it("takes env: names with the prefix only, and never a setting of the deployment's", async () => {
    expect(await refusal("env:BC_SECRET_HCLOUD", fence)).toBeNull();
    expect(await refusal("env:HOME", fence)).toMatch(/starting with BC_SECRET_/);
    expect(await refusal("env:DATABASE_URL", { ...fence, envPrefix: "" })).toMatch(/own settings/);
    expect(await refusal("env:SEAL_KEY", { ...fence, envPrefix: "" })).toMatch(/own settings/);
    expect(await refusal("env:HOME", { ...fence, envPrefix: "" })).toBeNull();
    for (const name of ["DATABASE_URL", "SEAL_KEY", "OPERATOR_TOKEN", "REDIS_URL", "BC_DATA_DIR", "BC_CONFIG", "PROVIDER_SECRET_DIR"])
      expect(settingNames).toContain(name);
  });

  it("takes file: paths inside the directory only, judged again where their links lead", async () => {
    expect(await refusal(`file:${join(secrets, "token")}`, fence)).toBeNull();
    expect(await refusal(`file:${join(secrets, "alias")}`, fence)).toBeNull();
    // Not there yet: judged by its path now, by where it leads when read.
    expect(await refusal(`file:${join(secrets, "later")}`, fence)).toBeNull();
    for (const path of [join(elsewhere, "passwd"), `${secrets}/../data/seal.key`, `${secrets}/./token`, join(secrets, "escape"), secrets, `${secrets}x/token`])
      expect(await refusal(`file:${path}`, fence), path).toMatch(/inside/);
    expect(await refusal(`file:${join(secrets, "token")}`, { ...fence, dir: undefined })).toMatch(/off in this deployment/);
  });

  it("never takes the data dir, even inside the secrets directory", async () => {
    const wide = { ...fence, dir: root };
    expect(await refusal(`file:${join(data, "seal.key")}`, wide)).toMatch(/data dir/);
    symlinkSync(join(data, "seal.key"), join(root, "to-seal"));
    expect(await refusal(`file:${join(root, "to-seal")}`, wide)).toMatch(/data dir/);
    expect((await readError(join(root, "to-seal"), wide)).fenced).toBe(true);
  });

  it("reads what the fence allows, without its newline, and refuses the rest by reason, never by content", async () => {
    expect(await readFenced(join(secrets, "token"), fence)).toBe("in-the-fence");
    expect(await readFenced(join(secrets, "alias"), fence)).toBe("in-the-fence");
    const escaped = await readError(join(secrets, "escape"));
    expect(escaped.fenced).toBe(true);
    expect(escaped.message).not.toContain("outside");
    expect((await readError(join(secrets, "missing"))).message).toMatch(/ENOENT/);
    expect((await readError(join(secrets, "sub"))).message).toMatch(/not a regular file/);
    expect((await readError(join(secrets, "big"))).message).toMatch(/larger than/);
  });

  it("is configured by vps.secretRefs or its variables, BC_SECRET_ and no directory by default", () => {
    expect(parseConfig().vps.secretRefs).toEqual({ envPrefix: "BC_SECRET_" });
    const env = parseConfig({ vps: { secretRefs: { dir: "/run/secrets" } } }, { PROVIDER_SECRET_ENV_PREFIX: "HZ_" }).vps.secretRefs;
    expect(env).toEqual({ envPrefix: "HZ_", dir: "/run/secrets" });
    expect(() => parseConfig({}, { PROVIDER_SECRET_DIR: "relative/dir" })).toThrow(/vps.secretRefs.dir/);
  });
});
