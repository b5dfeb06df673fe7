import type { RuntimeDeclaration } from "./declaration.ts";
import { fake } from "./fake/declaration.ts";
import { libvirtKvm } from "./libvirt-kvm/declaration.ts";
import type { Runtime } from "./runtime.ts";

export { fake, libvirtKvm };

/**
 * The runtimes an agent can drive, as they declare themselves (./declaration.ts): what `bc agent --runtime`
 * names, whose flags agent/config.ts reads, and what tests/conformance/runtime.ts runs its cases against.
 */
export const declarations = [fake, libvirtKvm] as const;

type OptionsOf<D> = D extends RuntimeDeclaration<infer O> ? O : never;
/** What an agent knows when it makes its runtime: its state dir, and each declared runtime's options (each takes its own). */
export type RuntimeOptions = { stateDir: string } & OptionsOf<typeof fake> & OptionsOf<typeof libvirtKvm>;
type Make = (o: RuntimeOptions) => Promise<Runtime> | Runtime;

/** The runtime `bc agent` runs when `--runtime` names none: a simulated host. */
export const defaultAgentRuntime = fake.id;

/** Each declared runtime's maker, by id. */
export const runtimes: Record<string, Make> = Object.fromEntries(declarations.map((d) => [d.id, d.make]));

/** A simulated host, as `bc dev --sim` makes them. */
export const fakeRuntime: Make = fake.make;
