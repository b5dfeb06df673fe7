import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Converger } from "../../agent/converge.ts";
import { InstanceLocks } from "../../agent/locks.ts";
import { renderRuleset } from "../../agent/network/ruleset.ts";
import { createFakeRuntime } from "../../agent/runtimes/fake/index.ts";
import type { Runtime } from "../../agent/runtimes/runtime.ts";
import { type InstanceSpec, instanceSpec, type NetworkPolicy, type NodeSpec, tapFor } from "../../contracts/host.ts";
import { sha256Of } from "../support/fixtures.ts";

/**
 * A converge pass on the fake runtime whose egress is the real renderer (what Egress.apply runs before nft): one
 * instance's policy the ruleset cannot hold costs that instance alone, reported as its own refusal.
 */

const id = (c: string) => `inst_${c.repeat(52)}`;
const [A, B, C] = [id("a"), id("b"), id("c")];
const ALLOW: NetworkPolicy = { egress: "allowlist", allow: [{ cidr: "10.0.0.0/8", port: 443, proto: "tcp" }] };
/** What the API took before it shared the host's parser. */
const LEADING_ZEROS = { egress: "allowlist", allow: [{ cidr: "010.000.000.001/32", port: 80, proto: "tcp" }] };

function spec(i: string, power: InstanceSpec["power"], network: unknown = ALLOW): InstanceSpec {
  const s = instanceSpec.parse({
    id: i,
    power,
    vcpus: 1,
    memoryMib: 512,
    diskGib: 10,
    gpus: [],
    image: { url: "https://images.example/base.qcow2", sha256: sha256Of("d"), format: "qcow2" },
    sshKeys: [],
    userData: null,
    hostname: "h",
    nic: { bridge: "br0", mac: "52:54:00:00:00:01", address: null, prefix: null, gateway: null },
    env: {},
    fromSnapshot: null,
  });
  // As the agent reads a spec off the wire: the policy as sent, checked by the converger.
  return { ...s, network: network as NetworkPolicy };
}
const node = (generation: number, instances: InstanceSpec[]): NodeSpec => ({ nodeId: "node_x", generation, runtime: "fake", instances, remove: [] });

let dir: string;
let rt: Runtime;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "bc-converge-isolation-"));
  rt = createFakeRuntime({ dir: join(dir, "host") });
});
afterEach(async () => {
  await rt.close();
  await rm(dir, { recursive: true, force: true });
});

/** An Egress whose nft takes whatever renders: it throws where Egress.apply would, and keeps what it loaded. */
function egress() {
  const loaded: string[][] = [];
  return {
    loaded,
    apply: async (policies: ReadonlyMap<string, NetworkPolicy>) => {
      renderRuleset(policies, { tapPrefix: "bct" });
      loaded.push([...policies.keys()].sort());
    },
  };
}
const stateOf = async (i: string) => (await rt.list()).find((d) => d.id === i)?.state;

describe("a policy the host cannot enforce", () => {
  it.each([
    ["a leading-zero address", LEADING_ZEROS],
    ["an out-of-range octet", { egress: "allowlist", allow: [{ cidr: "10.0.0.256/32", port: 80, proto: "tcp" }] }],
    ["text meant for nft", { egress: "allowlist", allow: [{ cidr: "10.0.0.0/8 accept; flush ruleset", port: null, proto: "udp" }] }],
    ["port 0", { egress: "allowlist", allow: [{ cidr: "10.0.0.0/8", port: 0, proto: "tcp" }] }],
    ["an unknown class", { egress: "open", allow: [] }],
    ["no policy at all", null],
  ])("(%s) is its instance's refusal; the others are made, started and stopped", async (_, bad) => {
    const rules = egress();
    const c = new Converger(rt, () => {}, new InstanceLocks(), rules);
    await c.converge(node(1, [spec(A, "running"), spec(B, "running", bad), spec(C, "running", { egress: "all", allow: [] })]));
    expect(await stateOf(A)).toBe("running");
    expect(await stateOf(C)).toBe("running");
    // Not made: its tap would be unclassified anyway, and the backstop drops an unclassified tap.
    expect(await stateOf(B)).toBeUndefined();
    expect(rules.loaded).toEqual([[tapFor(A), tapFor(C)].sort()]);
    const report = await c.report(1);
    expect(report.instances.find((i) => i.id === B)).toMatchObject({
      state: "failed",
      retryable: false,
      error: expect.stringMatching(/^egress policy refused: policy/),
    });
    expect(report.instances.filter((i) => i.id !== B).map((i) => i.state)).toEqual(["running", "running"]);

    // The next generation still converges the others; the refusal stands.
    await c.converge(node(2, [spec(A, "stopped"), spec(B, "running", bad), spec(C, "paused", { egress: "none", allow: [] })]));
    expect([await stateOf(A), await stateOf(C), await stateOf(B)]).toEqual(["stopped", "paused", undefined]);
    expect((await c.report(2)).instances.find((i) => i.id === B)).toMatchObject({ state: "failed", retryable: false });
  });

  it("names the entry the host refused", async () => {
    const c = new Converger(rt, () => {}, new InstanceLocks(), egress());
    await c.converge(node(1, [spec(B, "running", LEADING_ZEROS)]));
    const error = (await c.report(1)).instances[0]?.error;
    expect(error).toBe('egress policy refused: policy.allow.0.cidr: not a CIDR: "010.000.000.001/32"');
  });

  it("still lets the host stop a domain it has, and a good policy again converges it", async () => {
    const rules = egress();
    const c = new Converger(rt, () => {}, new InstanceLocks(), rules);
    await c.converge(node(1, [spec(B, "running"), spec(A, "running")]));
    expect(await stateOf(B)).toBe("running");
    await c.converge(node(2, [spec(B, "stopped", LEADING_ZEROS), spec(A, "running")]));
    expect(await stateOf(B)).toBe("stopped");
    expect((await c.report(2)).instances.find((i) => i.id === B)).toMatchObject({ state: "failed", retryable: false });
    expect(rules.loaded.at(-1)).toEqual([tapFor(A)]);
    await c.converge(node(3, [spec(B, "running"), spec(A, "running")]));
    expect(await stateOf(B)).toBe("running");
    expect((await c.report(3)).instances.find((i) => i.id === B)).toMatchObject({ state: "running", error: null });
  });

  it("leaves the host's own egress failure failing the pass, after the instances are converged", async () => {
    const c = new Converger(rt, () => {}, new InstanceLocks(), { apply: () => Promise.reject(new Error("egress: nft not found")) });
    await expect(c.converge(node(1, [spec(A, "running")]))).rejects.toThrow(/nft not found/);
    expect(await stateOf(A)).toBe("running");
  });
});
