import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Hosts, startHosts } from "../support/hosts.ts";

/**
 * The `bc` client commands as people and scripts run them: the real binary against a real server on simulated
 * hosts — login, tables, `--json`, `--wait` showing the steps, and exit codes that name the failure.
 */
let hosts: Hosts;
let home: string;
let tenant: Awaited<ReturnType<Hosts["h"]["tenant"]>>;

beforeAll(async () => {
  hosts = await startHosts(1);
  await hosts.start(0);
  tenant = await hosts.h.tenant();
  home = mkdtempSync(join(tmpdir(), "bc-cli-home-"));
});
afterAll(async () => {
  await hosts?.close();
  rmSync(home, { recursive: true, force: true });
});

function bc(args: string[], env: Record<string, string> = {}): Promise<{ code: number; out: string; err: string }> {
  return new Promise((resolve) => {
    const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !["BC_URL", "BC_TOKEN", "OPERATOR_TOKEN"].includes(k)));
    execFile(process.execPath, ["bin/bc.mjs", ...args], { env: { ...clean, XDG_CONFIG_HOME: home, ...env } }, (e, out, err) =>
      resolve({ code: e ? (typeof e.code === "number" ? e.code : 1) : 0, out, err }),
    );
  });
}

describe("bc, the client", () => {
  it("logs in once, checking the token, and keeps URL and token where only its owner reads them", async () => {
    const bad = await bc(["login", "--url", hosts.h.url, "--token", "bct_nope"]);
    expect(bad.code).toBe(4);
    expect(bad.err).toMatch(/^error: UNAUTHENTICATED: /);
    const ok = await bc(["login", "--url", hosts.h.url, "--token", tenant.token]);
    expect(ok.code).toBe(0);
    expect(ok.out).toContain(`logged in to ${hosts.h.url}`);
    expect(statSync(join(home, "bc", "config.json")).mode & 0o777).toBe(0o600);
  });

  it("creates an instance and, with --wait, shows each step until it runs; then lists, gets, stops and deletes it", async () => {
    const made = await bc(["instances", "create", "--pool", hosts.poolId, "--flavor", "small", "--image", hosts.imageId, "--wait"]);
    expect(made.code).toBe(0);
    const [id, state] = made.out.trim().split(" ");
    expect(state).toBe("RUNNING");
    // The steps it went through, in order, each once.
    const steps = made.err
      .trim()
      .split("\n")
      .map((l) => l.trim().split(/\s+/)[0]);
    expect(steps[steps.length - 1]).toBe("running");
    expect(new Set(steps).size).toBe(steps.length);

    const list = await bc(["instances", "list"]);
    expect(list.out.split("\n")[0]).toMatch(/^ID\s+STATE\s+DESIRED\s+FLAVOR\s+ADDRESSES\s+AGE$/);
    expect(list.out).toMatch(new RegExp(`^${id}\\s+RUNNING\\s+RUNNING\\s+small\\s+10\\.`, "m"));
    const json = JSON.parse((await bc(["instances", "list", "--json"])).out) as { id: string; state: string }[];
    expect(json.find((i) => i.id === id)?.state).toBe("RUNNING");
    const got = JSON.parse((await bc(["--json", "instances", "get", id as string])).out) as { id: string; flavor: string };
    expect(got).toMatchObject({ id, flavor: "small" });

    expect((await bc(["instances", "stop", id as string])).out).toContain("desired STOPPED");
    const gone = await bc(["instances", "delete", id as string]);
    expect(gone.code).toBe(0);
    const again = await bc(["instances", "start", id as string]);
    expect(again.code).toBe(5);
    expect(again.err).toMatch(/^error: PRECONDITION_FAILED: /);
  });

  it("names the failure in its exit code and message", async () => {
    const missing = await bc(["instances", "get", "inst_nothere"]);
    expect(missing.code).toBe(3);
    expect(missing.err).toMatch(/^error: NOT_FOUND/);
    const bad = await bc(["instances", "create", "--pool", hosts.poolId, "--flavor", "nope", "--image", hosts.imageId]);
    expect(bad.code).toBe(3);
    const forbidden = await bc(["pools", "--json"], { BC_TOKEN: tenant.token });
    expect(forbidden.code).toBe(0); // tenants may read pools
    const denied = await bc(["tokens", "create", "--tenant", tenant.id, "--name", "x"]);
    expect(denied.code).toBe(4);
    const usage = await bc(["usage", "--from", "yesterday", "--to", "now"]);
    expect(usage.code).toBe(2);
    expect(usage.err).toMatch(/^error: INVALID_INPUT/);
  });

  it("shows operators pools and nodes as tables, and makes tokens", async () => {
    const op = { BC_TOKEN: hosts.h.operatorToken };
    const pools = await bc(["pools"], op);
    expect(pools.out).toMatch(new RegExp(`^${hosts.poolId}\\s+sim\\s+VPS_HOST\\s+`, "m"));
    const nodes = await bc(["nodes", hosts.poolId], op);
    expect(nodes.out.split("\n")[0]).toMatch(/^ID\s+NAME\s+STATE\s+VCPU/);
    expect(nodes.out).toMatch(/host-1\s+READY\s+\d+\/8/);
    const made = await bc(["tokens", "create", "--tenant", tenant.id, "--name", "ci", "--json"], op);
    const { apiToken, token } = JSON.parse(made.out) as { apiToken: { id: string }; token: string };
    expect(token).toMatch(/^bct_/);
    expect((await bc(["tokens", "revoke", apiToken.id], op)).code).toBe(0);
    expect((await bc(["instances", "list"], { BC_TOKEN: token })).code).toBe(4);
  });
});
