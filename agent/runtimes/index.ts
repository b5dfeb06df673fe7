import { join } from "node:path";
import type { Capacity } from "../../core/protocol.ts";
import { createFakeRuntime } from "./fake.ts";
import type { Runtime } from "./runtime.ts";

/** The runtimes an agent can drive, by id (what `bc agent --runtime` and pools' `runtime` name). */
type Make = (o: { stateDir: string; capacity?: Capacity; delayMs?: number }) => Promise<Runtime> | Runtime;

const ops = ["create", "start", "stop", "pause", "resume", "remove", "resize"] as const;

export const fakeRuntime: Make = (o) =>
  createFakeRuntime({
    dir: join(o.stateDir, "fake-host"),
    capacity: o.capacity,
    delays: o.delayMs ? Object.fromEntries(ops.map((op) => [op, o.delayMs])) : undefined,
  });

export const runtimes: Record<string, Make> = { fake: fakeRuntime };
