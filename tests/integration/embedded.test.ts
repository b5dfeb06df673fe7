import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, lstatSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  CreateApiTokenDocument,
  CreateInstanceDocument,
  createClient,
  InstanceDocument,
  InstancesDocument,
  StopInstanceDocument,
  TenantsDocument,
  watchInstance,
} from "../../sdk/client.ts";

const children: ChildProcess[] = [];
const dirs: string[] = [];
/** Signal the whole process group (npm and the platform under it); false once none of it is left. */
const signalGroup = (c: ChildProcess, signal: NodeJS.Signals | 0) => {
  try {
    if (c.pid) process.kill(-c.pid, signal);
    return true;
  } catch {
    return false;
  }
};
const stop = (c: ChildProcess) => void signalGroup(c, "SIGTERM");
afterAll(() => {
  for (const c of children) stop(c);
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** `npm start` exactly as a newcomer runs it: no DATABASE_URL, no REDIS_URL, nothing but a data dir. */
async function startDev(dataDir: string): Promise<{ url: string; token: string; child: ChildProcess; banner: string }> {
  const env: NodeJS.ProcessEnv = { ...process.env, BC_DATA_DIR: dataDir, PORT: "0", LOG_LEVEL: "warn" };
  for (const k of ["DATABASE_URL", "REDIS_URL", "OPERATOR_TOKEN", "SEAL_KEY"]) delete env[k];
  // Its own process group, so stopping it stops npm's child too.
  const child = spawn("npm", ["start"], { env, stdio: ["ignore", "pipe", "pipe"], detached: true });
  children.push(child);
  let out = "";
  child.stdout?.on("data", (d) => (out += d));
  child.stderr?.on("data", (d) => (out += d));
  await expect.poll(() => /Try:/.test(out) || child.exitCode !== null, { timeout: 120_000, interval: 100 }).toBe(true);
  const url = /GraphQL:\s+(\S+)/.exec(out)?.[1];
  const token = /Operator: (\S+)/.exec(out)?.[1];
  if (!url || !token) throw new Error(`bc dev did not start:\n${out}`);
  return { url, token, child, banner: out };
}

/** Every file or directory under `root` that someone other than its owner may read, write or enter. */
function openToOthers(root: string): string[] {
  const found: string[] = [];
  for (const name of readdirSync(root, { recursive: true }) as string[]) {
    const st = lstatSync(join(root, name));
    if (!st.isSymbolicLink() && (st.mode & 0o077) !== 0) found.push(`${name} ${(st.mode & 0o777).toString(8)}`);
  }
  return found;
}

describe("npm start (bc dev --sim 3, embedded: PGlite, in-memory bus and jobs)", () => {
  it("serves GraphiQL and runs the README walkthrough, and keeps its data and token across a restart", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "bc-dev-"));
    dirs.push(dataDir);
    const first = await startDev(dataDir);
    const page = await fetch(first.url, { headers: { accept: "text/html" } });
    expect(page.status).toBe(200);
    expect(await page.text()).toMatch(/graphiql/i);

    // The quick start: the demo tenant's instance in pool "local" runs on a simulated host within seconds.
    const demoToken = /Tenant:\s+(\S+)/.exec(first.banner)?.[1] as string;
    const demo = createClient({ url: first.url, token: demoToken });
    const quick = (
      await demo.request(CreateInstanceDocument, {
        input: {
          poolId: /\((pool_[a-z2-7]+)\)/.exec(first.banner)?.[1] as string,
          flavor: "small",
          imageId: /image (img_[a-z2-7]+)/.exec(first.banner)?.[1] as string,
        },
      })
    ).createInstance;
    // Watched live, as the dashboard would: the in-memory bus and the PGlite event table behave as Redis and PostgreSQL do.
    const seen: string[] = [];
    for await (const e of watchInstance({ url: first.url, token: demoToken, id: quick.id, after: "0" })) {
      seen.push(e.toState);
      if (e.toState === "RUNNING") break;
    }
    expect(seen[0]).toBe("PENDING");
    expect((await demo.request(InstanceDocument, { id: quick.id })).instance?.state).toBe("RUNNING");
    // One process, one /metrics: the in-memory job runner's timings are on the server's page. A create runs
    // without a job (admission places it; the host's reports are reconciled where they arrive); a stop is the
    // reconciler's, through the queue.
    await demo.request(StopInstanceDocument, { id: quick.id });
    const jobRuns = async () => {
      const text = await (await fetch(first.url.replace(/\/graphql$/, "/metrics"))).text();
      return (
        /^bc_job_duration_seconds_count\{job="vps\.instances",outcome="ok"\} [1-9]/m.test(text) &&
        /^bc_job_wait_seconds_count\{job="vps\.instances"\} [1-9]/m.test(text)
      );
    };
    await expect.poll(jobRuns, { timeout: 10_000, interval: 100 }).toBe(true);
    // The database, the secrets, the hosts' state and the seed (the owner's user data) are the owner's alone.
    const seeds = (readdirSync(dataDir, { recursive: true }) as string[]).filter((p) => /fake-host\/seeds\/inst_\w+\.iso$/.test(p));
    expect(seeds).toHaveLength(1);
    // PGlite's own files are 0666 while it runs (its file layer ignores the umask), inside 0700 directories.
    expect(openToOthers(dataDir).filter((f) => !/^pglite\/.*666$/.test(f))).toEqual([]);

    // The README's walkthrough, exactly as a newcomer runs it.
    const walk = spawnSync(process.execPath, ["--import", "tsx", "examples/walkthrough.ts"], {
      env: { ...process.env, BC_URL: first.url, OPERATOR_TOKEN: first.token },
      encoding: "utf8",
    });
    expect(walk.stderr).toBe("");
    expect(walk.stdout).toMatch(/^inst_[a-z2-7]{52} PROVISIONING on node_[a-z2-7]+ at 10\.42\.0\.2\n$/);
    const instanceId = walk.stdout.split(" ")[0] as string;
    const op = createClient({ url: first.url, token: first.token });
    const tenantId = (await op.request(TenantsDocument)).tenants.find((x) => x.name === "acme")?.id as string;
    const { createApiToken } = await op.request(CreateApiTokenDocument, { input: { tenantId, name: "second-laptop" } });

    stop(first.child);
    await expect.poll(() => signalGroup(first.child, 0), { timeout: 20_000, interval: 100 }).toBe(false);
    expect(openToOthers(dataDir)).toEqual([]);
    // A host killed while writing a seed leaves its temporary behind; the next start sweeps it.
    const leftover = join(dataDir, "sim", "host-1", "fake-host", "seeds", "inst_x.iso.4242.1.tmp");
    writeFileSync(leftover, "half a seed");
    const second = await startDev(dataDir);
    expect(existsSync(leftover)).toBe(false);
    expect(second.token).toBe(first.token);
    const again = createClient({ url: second.url, token: createApiToken.token });
    // The walkthrough's node was made by hand and runs no agent: the reconciler takes the instance as far as
    // provisioning, where it waits for a host to report it.
    const list = async () => (await again.request(InstancesDocument, { owner: "TENANT" })).instances.edges.map((e) => e.node);
    await expect.poll(async () => (await list())[0]?.state, { timeout: 20_000, interval: 200 }).toBe("PROVISIONING");
    expect(await list()).toMatchObject([{ id: instanceId, addresses: ["10.42.0.2"] }]);
    // The sealing key survived the restart too: sealed user data written before it still opens after.
    const [made] = await list();
    const { createInstance } = await again.request(CreateInstanceDocument, {
      input: { poolId: made?.poolId as string, flavor: "small", imageId: made?.imageId as string, userData: "hi" },
    });
    expect(createInstance.userData).toBe("hi");
    // Two cold starts of npm, tsx and PGlite: on a loaded 2-core CI machine that alone has taken over a minute.
  }, 300_000);
});
