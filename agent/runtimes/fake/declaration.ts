import { join } from "node:path";
import type { Capacity } from "../../../contracts/host.ts";
import { defineRuntime, integer } from "../declaration.ts";
import { createFakeRuntime, fakeOps } from "./index.ts";

/** `bc agent --runtime fake`: a simulated host. Its flags say what it offers and how slow it is; a real runtime reads the host. */
export const fake = defineRuntime({
  id: "fake",
  flags: {
    vcpus: { type: "string", schema: integer(1).default(16) },
    "memory-mib": { type: "string", schema: integer(1).default(65536) },
    "disk-gib": { type: "string", schema: integer(1).default(1000) },
    "delay-ms": { type: "string", schema: integer(0).default(0) },
  },
  env: {},
  options: (f): { capacity?: Capacity; delayMs?: number } => ({
    capacity: { vcpus: f.vcpus, memoryMib: f["memory-mib"], diskGib: f["disk-gib"], gpus: [] },
    delayMs: f["delay-ms"],
  }),
  make: (o) =>
    createFakeRuntime({
      dir: join(o.stateDir, "fake-host"),
      capacity: o.capacity,
      delays: o.delayMs ? Object.fromEntries(fakeOps.map((op) => [op, o.delayMs])) : undefined,
    }),
});
