import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  CreateApiTokenDocument,
  CreateFlavorDocument,
  CreateInstanceDocument,
  CreateNodeDocument,
  CreatePoolDocument,
  CreateTenantDocument,
  createClient,
  InstancesDocument,
  RegisterImageDocument,
} from "../../sdk/client.ts";
import { sha256Of } from "../support/fixtures.ts";

const children: ChildProcess[] = [];
const dirs: string[] = [];
afterAll(() => {
  for (const c of children) c.kill("SIGTERM");
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** `bc dev` as a newcomer runs it: no DATABASE_URL, no REDIS_URL, nothing but a data dir. */
async function startDev(dataDir: string): Promise<{ url: string; token: string; child: ChildProcess }> {
  const env: NodeJS.ProcessEnv = { ...process.env, BC_DATA_DIR: dataDir, PORT: "0", LOG_LEVEL: "warn" };
  for (const k of ["DATABASE_URL", "REDIS_URL", "OPERATOR_TOKEN", "SEAL_KEY"]) delete env[k];
  const child = spawn(process.execPath, ["bin/bc.mjs", "dev"], { env, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let out = "";
  child.stdout?.on("data", (d) => (out += d));
  child.stderr?.on("data", (d) => (out += d));
  await expect.poll(() => /Operator: (\S+)/.test(out) || child.exitCode !== null, { timeout: 60_000, interval: 100 }).toBe(true);
  const url = /GraphQL:\s+(\S+)/.exec(out)?.[1];
  const token = /Operator: (\S+)/.exec(out)?.[1];
  if (!url || !token) throw new Error(`bc dev did not start:\n${out}`);
  return { url, token, child };
}

describe("bc dev (embedded: PGlite, in-memory bus and jobs)", () => {
  it("serves GraphiQL and runs the README walkthrough, and keeps its data and token across a restart", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "bc-dev-"));
    dirs.push(dataDir);
    const first = await startDev(dataDir);
    const page = await fetch(first.url, { headers: { accept: "text/html" } });
    expect(page.status).toBe(200);
    expect(await page.text()).toMatch(/graphiql/i);

    const op = createClient({ url: first.url, token: first.token });
    const { createTenant } = await op.request(CreateTenantDocument, { input: { name: "acme" } });
    const { createApiToken } = await op.request(CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "laptop" } });
    const { createPool } = await op.request(CreatePoolDocument, { input: { name: "home", class: "VPS_HOST", ipv4Range: "10.42.0.0/24" } });
    await op.request(CreateNodeDocument, { input: { poolId: createPool.id, name: "box-1", capacity: { vcpus: 8, memoryMib: 16384, diskGib: 200 } } });
    await op.request(CreateFlavorDocument, { input: { poolId: createPool.id, name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 } });
    const { registerImage } = await op.request(RegisterImageDocument, {
      input: { name: "debian", source: "https://images.invalid/d.qcow2", sha256: sha256Of("a"), format: "QCOW2", public: true },
    });
    const tenant = createClient({ url: first.url, token: createApiToken.token });
    const inst = (
      await tenant.request(CreateInstanceDocument, { input: { poolId: createPool.id, flavor: "small", imageId: registerImage.id, userData: "hi" } })
    ).createInstance;
    expect(inst).toMatchObject({ state: "PENDING", addresses: ["10.42.0.2"], userData: "hi" });

    first.child.kill("SIGTERM");
    await expect.poll(() => first.child.exitCode, { timeout: 20_000, interval: 100 }).not.toBeNull();
    const second = await startDev(dataDir);
    expect(second.token).toBe(first.token);
    const again = createClient({ url: second.url, token: createApiToken.token });
    const list = (await again.request(InstancesDocument, {})).instances.edges.map((e) => e.node);
    // The sealing key survived too: the owner still reads its user data.
    expect(list).toMatchObject([{ id: inst.id, userData: "hi" }]);
  });
});
