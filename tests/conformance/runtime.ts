import { existsSync, readFileSync } from "node:fs";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { RuntimeDeclaration } from "../../agent/runtimes/declaration.ts";
import { type Runtime, RuntimeError } from "../../agent/runtimes/runtime.ts";
import type { ExecRequest, InstanceSpec } from "../../contracts/host.ts";
import type { RuntimeTraits } from "../../contracts/runtimes.ts";
import { until } from "../support/fixtures.ts";

/**
 * The runtime conformance suite: the same cases against every runtime, through the `Runtime` interface alone,
 * each runtime made by its declaration (agent/runtimes/<id>/declaration.ts). A case that needs a trait the
 * runtime lacks is skipped, and its title says which. One test file per runtime calls `runtimeConformance`
 * with a harness: what only the runtime's own tests can know (a spec it can boot, where create puts files,
 * how its guest is made to crash, how long a guest takes to come up).
 */

export interface RuntimeHarness {
  /** A new runtime object on the harness's state (its directory, its libvirtd): the same domains each time. */
  open(): Promise<Runtime>;
  /** A spec the runtime can create and boot, named `id`, with `over` on top. */
  spec(id: string, over?: Partial<InstanceSpec>): InstanceSpec;
  /** What create makes beside the domain: its disk (an overlay on the base) and its NoCloud seed. */
  files(id: string): { overlay: string; seed: string };
  /** Makes a running domain's guest crash, from outside the runtime, as its hypervisor would show a crash. */
  crash(id: string): Promise<void>;
  /** Resolves once a started guest runs commands (exec). */
  ready(rt: Runtime, id: string): Promise<void>;
  /** A spec whose image is a qcow2 that names a backing file (checksImages). */
  backedImage?(id: string): InstanceSpec;
  close(): Promise<void>;
}

export interface ConformanceOptions {
  declaration: Pick<RuntimeDeclaration, "id" | "traits">;
  /** For each case: a real guest boots within it. */
  timeoutMs: number;
  /** For the harness's own setup (building a guest, say). */
  setupTimeoutMs?: number;
}

type Trait = keyof RuntimeTraits;
type Req = Omit<ExecRequest, "instanceId">;
const req = (command: string[], over: Partial<Req> = {}): Req => ({ command, env: {}, stdin: null, timeoutMs: 30_000, ...over });
/** The base32 alphabet of instance ids: what libvirt-kvm takes for an instance's domain name. */
const B32 = "abcdefghijklmnopqrstuvwxyz234567";

export function runtimeConformance(o: ConformanceOptions, makeHarness: () => Promise<RuntimeHarness>): void {
  const { id: runtimeId, traits } = o.declaration;
  /** A case of `needs`: skipped, and saying why, where the runtime lacks any of them. */
  const test = (needs: Trait[], title: string, fn: () => Promise<void>) => {
    const missing = needs.filter((t) => !traits[t]);
    it.skipIf(missing.length > 0)(missing.length ? `${title} (skipped: ${runtimeId} lacks ${missing.join(", ")})` : title, fn, o.timeoutMs);
  };

  let h: RuntimeHarness;
  let rt: Runtime;
  const made: string[] = [];
  // Distinct in the first 12 characters after `inst_` (what names a libvirt tap), and from other processes' ids.
  const tag = process.pid.toString(32).replace(/[^a-z2-7]/g, "a");
  let n = 0;
  const newId = () => {
    const id = `inst_cf${B32[Math.floor(n / 32) % 32]}${B32[n % 32]}${tag}`;
    n++;
    made.push(id);
    return id;
  };
  const listed = async (id: string, on: Runtime = rt) => (await on.list()).find((d) => d.id === id);
  const stateOf = async (id: string, on: Runtime = rt) => (await listed(id, on))?.state;
  /** A domain made and started. */
  const running = async (over: Partial<InstanceSpec> = {}) => {
    const s = h.spec(newId(), over);
    await rt.create(s);
    await rt.start(s.id);
    return s;
  };
  const refusal = async (p: Promise<unknown>) => {
    const err = await p.then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(RuntimeError);
    return err as RuntimeError;
  };
  const run = async (id: string, r: Req) => {
    const out = { stdout: "", stderr: "" };
    const result = await rt.exec(id, r, (stream, data) => {
      out[stream] += data;
    });
    return { ...result, ...out };
  };

  describe(`runtime conformance: ${runtimeId}`, () => {
    beforeAll(async () => {
      h = await makeHarness();
      rt = await h.open();
    }, o.setupTimeoutMs ?? o.timeoutMs);
    // Each case's domains go with it: a real guest left running would slow every case after it.
    afterEach(async () => {
      for (const id of made.splice(0)) await rt.remove(id).catch(() => {});
    });
    afterAll(async () => {
      await rt?.close();
      await h?.close();
    });

    test([], "creates the domain defined and stopped, with its shape, overlay and seed; remove takes them all", async () => {
      const s = h.spec(newId());
      await rt.create(s);
      expect(await listed(s.id)).toEqual({ id: s.id, state: "stopped", shape: { vcpus: s.vcpus, memoryMib: s.memoryMib, diskGib: s.diskGib }, addresses: [] });
      const { overlay, seed } = h.files(s.id);
      expect(existsSync(overlay)).toBe(true);
      // The seed's files are stored as they are (ISO 9660 or the fake's JSON): its meta-data names the instance.
      expect(readFileSync(seed).toString("latin1")).toContain(`instance-id: ${s.id}`);
      await rt.remove(s.id);
      expect(await listed(s.id)).toBeUndefined();
      expect(existsSync(overlay)).toBe(false);
      expect(existsSync(seed)).toBe(false);
    });

    test([], "starts and stops, again and again", async () => {
      const s = await running();
      expect(await stateOf(s.id)).toBe("running");
      await rt.stop(s.id);
      expect(await stateOf(s.id)).toBe("stopped");
      await rt.start(s.id);
      expect(await stateOf(s.id)).toBe("running");
      await rt.stop(s.id);
      expect(await stateOf(s.id)).toBe("stopped");
    });

    test([], "applies each call idempotently: create, start, stop and remove twice, and a remove of what never was", async () => {
      const s = h.spec(newId());
      await rt.create(s);
      await rt.create({ ...s, vcpus: s.vcpus + 1 });
      expect(await listed(s.id)).toMatchObject({ state: "stopped", shape: { vcpus: s.vcpus } });
      await rt.start(s.id);
      await rt.start(s.id);
      expect(await stateOf(s.id)).toBe("running");
      // Made once: a create of a domain there already changes neither its power nor its shape.
      await rt.create({ ...s, vcpus: s.vcpus + 1 });
      expect(await listed(s.id)).toMatchObject({ state: "running", shape: { vcpus: s.vcpus } });
      await rt.stop(s.id);
      await rt.stop(s.id);
      expect(await stateOf(s.id)).toBe("stopped");
      await rt.remove(s.id);
      await rt.remove(s.id);
      await rt.remove(newId());
      expect(await listed(s.id)).toBeUndefined();
    });

    test([], "lists a guest that crashed as crashed, until it is stopped or started", async () => {
      const s = await running();
      // Listed running first, as an agent's reports list it: a runtime may tell a crash from a stop by what it saw before.
      expect(await stateOf(s.id)).toBe("running");
      await h.crash(s.id);
      await until("the crash to be listed", async () => (await stateOf(s.id)) === "crashed", 30_000, 50);
      expect(await stateOf(s.id)).toBe("crashed"); // nothing acted on it: still crashed
      await rt.stop(s.id);
      expect(await stateOf(s.id)).toBe("stopped");
      await rt.start(s.id);
      expect(await stateOf(s.id)).toBe("running");
      await h.crash(s.id);
      await until("the second crash to be listed", async () => (await stateOf(s.id)) === "crashed", 30_000, 50);
      await rt.start(s.id);
      expect(await stateOf(s.id)).toBe("running");
    });

    test([], "a new runtime object on the same state lists the same domains, and drives them", async () => {
      const first = await h.open();
      const [a, b] = [h.spec(newId()), h.spec(newId())];
      await first.create(a);
      await first.create(b);
      await first.start(a.id);
      const before = (await first.list()).filter((d) => d.id === a.id || d.id === b.id);
      await first.close();
      const second = await h.open();
      try {
        const after = (await second.list()).filter((d) => d.id === a.id || d.id === b.id);
        expect(after).toEqual(before);
        expect(after.map((d) => [d.id, d.state]).sort()).toEqual([
          [a.id, "running"],
          [b.id, "stopped"],
        ]);
        await second.stop(a.id);
        expect(await stateOf(a.id, second)).toBe("stopped");
        expect(await stateOf(a.id)).toBe("stopped"); // and the runtime the other cases use sees it too
      } finally {
        await second.close();
      }
    });

    describe("pause", () => {
      test(["pause"], "pauses and resumes, each idempotently; a paused domain can be stopped", async () => {
        const s = await running();
        expect(await stateOf(s.id)).toBe("running");
        await rt.start(s.id);
        expect(await stateOf(s.id)).toBe("running");
        await rt.resume(s.id); // running already: nothing to do
        expect(await stateOf(s.id)).toBe("running");
        await rt.pause(s.id);
        await rt.pause(s.id);
        expect(await stateOf(s.id)).toBe("paused");
        await rt.resume(s.id);
        expect(await stateOf(s.id)).toBe("running");
        await rt.resume(s.id);
        expect(await stateOf(s.id)).toBe("running");
        await rt.pause(s.id);
        await rt.stop(s.id);
        await rt.stop(s.id);
        expect(await stateOf(s.id)).toBe("stopped");
      });
    });

    describe("snapshots", () => {
      test(["snapshots"], "snapshots a running or paused domain, once per id, and restores it in the power state it was saved in", async () => {
        const s = await running();
        const { sizeBytes } = await rt.snapshot(s.id, "snap_run");
        expect(sizeBytes).toBeGreaterThan(0);
        expect(await stateOf(s.id)).toBe("running");
        expect(await rt.snapshot(s.id, "snap_run")).toEqual({ sizeBytes }); // taken once: its size again
        await rt.pause(s.id);
        await rt.snapshot(s.id, "snap_paused");
        expect(await stateOf(s.id)).toBe("paused");
        await rt.resume(s.id);
        await rt.restore(s.id, "snap_paused"); // over a running domain
        expect(await stateOf(s.id)).toBe("paused");
        await rt.restore(s.id, "snap_run"); // over a paused one
        expect(await stateOf(s.id)).toBe("running");
        await rt.stop(s.id);
        await rt.restore(s.id, "snap_run"); // over a stopped one, and again: a snapshot stays usable
        expect(await stateOf(s.id)).toBe("running");

        const unknown = await refusal(rt.restore(s.id, "snap_never"));
        expect(unknown).toMatchObject({ retryable: false, message: expect.stringContaining("snap_never") });
        expect(await stateOf(s.id)).toBe("running");
        await rt.stop(s.id);
        expect(await refusal(rt.snapshot(s.id, "snap_stopped"))).toMatchObject({ retryable: false }); // no memory to save
      });

      test(["snapshots", "exec"], "restores what the guest had at the snapshot, not what it did after", async () => {
        const s = await running();
        await h.ready(rt, s.id);
        expect(await run(s.id, req(["sh", "-c", "echo before > bc-mark"]))).toMatchObject({ exitCode: 0 });
        await rt.snapshot(s.id, "snap_mark");
        expect(await run(s.id, req(["sh", "-c", "echo after > bc-mark"]))).toMatchObject({ exitCode: 0 });
        await rt.restore(s.id, "snap_mark");
        await h.ready(rt, s.id);
        expect(await run(s.id, req(["cat", "bc-mark"]))).toMatchObject({ exitCode: 0, stdout: "before\n" });
      });
    });

    describe("exec", () => {
      test(["exec"], "runs a command in the guest: output by stream, exit code, the spec's env under the request's, stdin, a timeout", async () => {
        const s = await running({ env: { BC_SPEC: "spec", SHARED: "spec" } });
        await h.ready(rt, s.id);
        const env = await run(s.id, req(["sh", "-c", 'echo "$BC_SPEC|$SHARED|$BC_REQ"; echo err >&2; exit 3'], { env: { SHARED: "req", BC_REQ: "req" } }));
        expect(env).toEqual({ exitCode: 3, signal: null, timedOut: false, stdout: "spec|req|req\n", stderr: "err\n" });
        expect(await run(s.id, req(["cat"], { stdin: "hello\nwörld\n" }))).toMatchObject({ exitCode: 0, stdout: "hello\nwörld\n", stderr: "" });
        const missing = await run(s.id, req(["no-such-program-here"]));
        expect(missing.exitCode).toBe(127);
        expect(missing.stderr).toContain("no-such-program-here");
        expect(await run(s.id, req(["sleep", "30"], { timeoutMs: 1000 }))).toMatchObject({ exitCode: null, signal: "SIGKILL", timedOut: true });
      });

      test(["exec"], "refuses exec in a stopped guest, not retryable", async () => {
        const s = h.spec(newId());
        await rt.create(s);
        expect(await refusal(rt.exec(s.id, req(["true"]), () => {}))).toMatchObject({ retryable: false, message: expect.stringContaining("stopped") });
      });

      test(["exec", "pause"], "refuses exec in a paused guest, not retryable", async () => {
        const s = await running();
        await rt.pause(s.id);
        expect(await refusal(rt.exec(s.id, req(["true"]), () => {}))).toMatchObject({ retryable: false, message: expect.stringContaining("paused") });
      });
    });

    describe("image checks", () => {
      test(["checksImages"], "refuses an image that names a backing file, for good, and defines nothing", async () => {
        if (!h.backedImage) throw new Error(`the ${runtimeId} harness has no backedImage, though the runtime checks images`);
        const s = h.backedImage(newId());
        const err = await refusal(rt.create(s));
        expect(err).toMatchObject({ retryable: false, message: "image names a backing file; refused" });
        expect(await listed(s.id)).toBeUndefined();
      });
    });
  });
}
