import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect, it } from "vitest";
import { crashDomain } from "../../agent/runtimes/fake/index.ts";
import { declarations, fake } from "../../agent/runtimes/registry.ts";
import { type InstanceSpec, instanceSpec } from "../../contracts/host.ts";
import { runtimeIds, runtimeTraits } from "../../contracts/runtimes.ts";
import { runtimeConformance } from "../conformance/runtime.ts";

/** The runtime conformance suite (tests/conformance/runtime.ts) on the fake runtime, as `bc agent --runtime fake` makes it. */

runtimeConformance({ declaration: fake, timeoutMs: 30_000 }, async () => {
  const stateDir = await mkdtemp(join(tmpdir(), "bc-conformance-fake-"));
  // Where the fake's declaration puts the runtime's files under the agent's state dir.
  const dir = join(stateDir, "fake-host");
  return {
    open: async () => fake.make({ stateDir }),
    spec: (id: string, over: Partial<InstanceSpec> = {}) =>
      instanceSpec.parse({
        id,
        power: "running",
        vcpus: 2,
        memoryMib: 2048,
        diskGib: 20,
        gpus: [],
        image: { url: "https://images.example/debian-12.qcow2", sha256: "ab".repeat(32), format: "qcow2" },
        sshKeys: [],
        userData: null,
        hostname: id,
        nic: { bridge: "br-bc", mac: "52:54:00:12:34:56", address: "10.20.0.5", prefix: 24, gateway: "10.20.0.1" },
        env: {},
        network: { egress: "all", allow: [] },
        fromSnapshot: null,
        ...over,
      }),
    files: (id: string) => ({ overlay: join(dir, "overlays", `${id}.qcow2`), seed: join(dir, "seeds", `${id}.iso`) }),
    crash: async (id: string) => crashDomain(dir, id),
    // The fake's guest is up as soon as it is started.
    ready: async () => {},
    close: () => rm(stateDir, { recursive: true, force: true }),
  };
});

it("the agent declares every runtime contracts/runtimes.ts knows, once, with the traits listed there", () => {
  expect(declarations.map((d) => d.id).sort()).toEqual([...runtimeIds].sort());
  for (const d of declarations) expect(d.traits).toBe(runtimeTraits[d.id]);
});
