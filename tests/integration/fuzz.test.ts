import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import fc from "fast-check";
import {
  type GraphQLArgument,
  type GraphQLField,
  type GraphQLInputType,
  getNamedType,
  isEnumType,
  isInputObjectType,
  isLeafType,
  isListType,
  isNonNullType,
  isScalarType,
  parse,
} from "graphql";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { errorCodes } from "../../contracts/errors.ts";
import * as bc from "../../sdk/client.ts";
import { schema } from "../../server/schema/index.ts";
import { until } from "../support/fixtures.ts";
import { type Harness, startHarness } from "../support/harness.ts";
import { invariantViolations } from "../support/ledger.ts";
import { watcher } from "../support/live.ts";
import { walk } from "../support/reconcile.ts";

/**
 * Schema-driven fuzzing: every query and mutation of the schema, called by every kind of caller with arguments
 * generated from its argument types — well-typed, so they reach the resolvers, but hostile: other tenants' and
 * made-up ids, empty, huge and control-character strings, extreme numbers, odd JSON. Whatever happens, the
 * answer is a typed error (never INTERNAL) or a success, and the books balance afterwards. A new operation
 * joins by being in the schema. FUZZ_RUNS and FUZZ_SEED widen or replay a run; a failure prints its seed.
 */

const RUNS = Number(process.env.FUZZ_RUNS ?? 12);
const SEED = Number(process.env.FUZZ_SEED ?? 20261201);

let h: Harness;
const ids: string[] = [];
let callers: { name: string; client: bc.Client; token?: string }[] = [];

beforeAll(async () => {
  h = await startHarness({ PROVIDERS: "hetzner-cloud" });
  // A world with one of everything, so generated ids are sometimes real (and sometimes another tenant's).
  const a = await h.tenant({ quota: { vcpus: 16 } });
  const b = await h.tenant();
  const pool = await h.hostedPool({ ipv4Range: "10.41.0.0/24" });
  const { createInstance: vm } = await a.client.request(bc.CreateInstanceDocument, {
    input: { poolId: pool.poolId, flavor: "small", imageId: pool.imageId, idempotencyKey: "fuzz" },
  });
  await walk(h.platform, vm.id, ["scheduling", "provisioning", "starting", "running"]);
  const { snapshotInstance: snap } = await h.operator.request(bc.SnapshotInstanceDocument, { id: vm.id });
  const { createJoinToken } = await h.operator.request(bc.CreateJoinTokenDocument, { poolId: pool.poolId });
  const { joinNode } = await h.client().request(bc.JoinNodeDocument, { token: createJoinToken.token, name: "fuzz-host" });
  const { flavors } = await h.operator.request(bc.FlavorsDocument, { poolId: pool.poolId });
  ids.push(a.id, b.id, pool.poolId, pool.imageId, ...pool.nodeIds, vm.id, snap.id, joinNode.nodeId, ...flavors.map((f) => f.id));
  callers = [
    { name: "operator", client: h.operator, token: h.operatorToken },
    { name: "tenant", client: a.client, token: a.token },
    { name: "other tenant", client: b.client, token: b.token },
    { name: "host", client: h.client(joinNode.credential), token: joinNode.credential },
    { name: "anonymous", client: h.client() },
  ];
});
afterAll(() => h?.close());

const hostile = fc.constantFrom("", " ", "a", "x".repeat(5000), "ü🙂", "a\u0000b", "' OR 1=1 --", "%", "../../etc/passwd", "inst_", "{}", "null");
const madeUpId = fc.oneof(
  fc.constantFrom("inst_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "pool_x", "node_x", "snap_x", "ten_x", "tok_x", "flv_x", "pacc_x"),
  fc.string({ maxLength: 40 }),
);

function arbitraryFor(type: GraphQLInputType, depth = 0): fc.Arbitrary<unknown> {
  if (isNonNullType(type)) return arbitraryFor(type.ofType, depth);
  const nullable = (a: fc.Arbitrary<unknown>) => fc.oneof({ weight: 5, arbitrary: a }, { weight: 1, arbitrary: fc.constant(null) });
  if (isListType(type)) return nullable(fc.array(arbitraryFor(type.ofType, depth + 1), { maxLength: depth > 1 ? 1 : 3 }));
  if (isEnumType(type)) return nullable(fc.constantFrom(...type.getValues().map((v) => v.name)));
  if (isInputObjectType(type)) {
    const fields = Object.values(type.getFields());
    return nullable(
      fc.record(Object.fromEntries(fields.map((f) => [f.name, arbitraryFor(f.type, depth + 1)])), {
        requiredKeys: fields.filter((f) => isNonNullType(f.type)).map((f) => f.name),
      }),
    );
  }
  if (isScalarType(type)) {
    switch (type.name) {
      case "ID":
        return nullable(fc.oneof(fc.constantFrom(...ids), madeUpId, hostile));
      case "String":
        return nullable(fc.oneof(hostile, fc.string({ maxLength: 80 }), fc.constantFrom("small", "medium", "cx22", "debian-12", "web")));
      case "Int":
        return nullable(fc.oneof(fc.constantFrom(0, -1, 1, 2 ** 31 - 1, -(2 ** 31), 500, 501), fc.integer()));
      case "Float":
        return nullable(fc.oneof(fc.constantFrom(0, -1.5, 1e308), fc.double({ noNaN: true, noDefaultInfinity: true })));
      case "Boolean":
        return nullable(fc.boolean());
      case "DateTime":
        return nullable(
          fc.oneof(
            fc.constantFrom("2020-01-01T00:00:00Z", "2999-01-01T00:00:00Z", "+099999-01-01T00:00:00Z", "-000001-01-01T00:00:00Z", "yesterday", ""),
            fc.date({ noInvalidDate: true }).map((d) => d.toISOString()),
          ),
        );
      case "JSON":
        return nullable(
          fc.oneof(fc.jsonValue({ maxDepth: 3 }), fc.constantFrom({}, [], { generation: 1, instances: [], capacity: {} }, { id: "cmd_a", state: "running" })),
        );
    }
  }
  throw new Error(`no generator for ${String(type)}`);
}

/** The operation for one field, with every argument as a variable and the least selection the type allows. */
function operation(kind: "query" | "mutation" | "subscription", field: GraphQLField<unknown, unknown>): string {
  const vars = field.args.map((a: GraphQLArgument) => `$${a.name}: ${String(a.type)}`).join(", ");
  const args = field.args.map((a) => `${a.name}: $${a.name}`).join(", ");
  const selection = isLeafType(getNamedType(field.type)) ? "" : " { __typename }";
  return `${kind}${vars ? `(${vars})` : ""} { ${field.name}${args ? `(${args})` : ""}${selection} }`;
}

/** What every committed change leaves behind: an audit row (mutations that changed something) or an event. */
const written = () =>
  h.platform.db.prisma.$queryRawUnsafe<{ audit: bigint; events: bigint }[]>(
    `SELECT (SELECT count(*) FROM audit_log) AS audit, (SELECT count(*) FROM instance_events) AS events`,
  );

const fields = (kind: "query" | "mutation") =>
  Object.values((kind === "query" ? schema.getQueryType() : schema.getMutationType())?.getFields() ?? {}).map((f) => ({ kind, field: f }));

describe("every operation under hostile input", () => {
  for (const { kind, field } of [...fields("query"), ...fields("mutation")]) {
    it(`${kind} ${field.name} answers with a success or a typed error`, async () => {
      const doc = parse(operation(kind, field));
      const vars = fc.record(Object.fromEntries(field.args.map((a) => [a.name, arbitraryFor(a.type)])));
      await fc.assert(
        fc.asyncProperty(fc.constantFrom(...callers), vars, async (caller, variables) => {
          const before = kind === "mutation" ? await written() : null;
          try {
            await caller.client.request(doc as TypedDocumentNode<unknown, Record<string, unknown>>, variables);
          } catch (e) {
            const code = (e as { code?: string }).code;
            if (!(errorCodes as readonly string[]).includes(code ?? "")) throw new Error(`${caller.name}: ${code}: ${(e as Error).message}`);
            // A refusal changes nothing: no audit row, no event (a write that committed and then failed would show here).
            if (before) expect(await written(), `${caller.name}: ${code} after writing`).toEqual(before);
          }
        }),
        { numRuns: RUNS * callers.length, seed: SEED, endOnFailure: true },
      );
    });
  }

  for (const field of Object.values(schema.getSubscriptionType()?.getFields() ?? {})) {
    it(`subscription ${field.name} answers with a stream or a typed error, and lets go when closed`, async () => {
      const query = operation("subscription", field);
      const vars = fc.record(Object.fromEntries(field.args.map((a) => [a.name, arbitraryFor(a.type)])));
      await fc.assert(
        fc.asyncProperty(fc.constantFrom(...callers), vars, async (caller, variables) => {
          const open = h.app.liveOperations();
          const w = watcher(h.url, caller.token, query, variables as Record<string, unknown>);
          // Accepted (a source opened, or data came) or refused: one of the two happens, within a bound.
          await until(
            "the subscription accepted or refused",
            () => w.errors.length > 0 || w.events.length > 0 || w.closed !== null || h.app.liveOperations() > open,
            10_000,
            5,
          );
          await w.dispose();
          for (const e of w.errors) {
            const code = (e as { extensions?: { code?: string } }).extensions?.code;
            if (!(errorCodes as readonly string[]).includes(code ?? "")) throw new Error(`${caller.name}: ${code}: ${JSON.stringify(e)}`);
          }
          await until("the closed subscription released", () => h.app.liveOperations() === open, 10_000, 5);
        }),
        { numRuns: RUNS * callers.length, seed: SEED, endOnFailure: true },
      );
    });
  }

  it("leaves the books balanced", async () => {
    expect(await invariantViolations(h.platform)).toEqual([]);
  });
});
