import type { GraphQLField } from "graphql";
import { describe, expect, it } from "vitest";
import { schema } from "../../server/schema/index.ts";

/**
 * Who may call is declared on each field of Query, Mutation and Subscription (`t.withAuth({ … })`, the scopes of
 * server/schema/builder.ts), never left to its resolver: a field added without a declaration fails here. A public
 * field says so (`{ public: true }`) and is listed below, so making one public is a visible choice.
 */
const PUBLIC = ["Mutation.joinNode"];

interface PothosExtensions {
  pothosOptions?: { authScopes?: Record<string, unknown> | ((...a: unknown[]) => unknown) };
  pothosResolveWrapped?: boolean;
  pothosSubscribeWrapped?: boolean;
}

const roots = [schema.getQueryType(), schema.getMutationType(), schema.getSubscriptionType()];
const fields = roots.flatMap((type) =>
  type ? Object.values(type.getFields()).map((f: GraphQLField<unknown, unknown>) => ({ name: `${type.name}.${f.name}`, root: type.name, field: f })) : [],
);
const ext = (f: GraphQLField<unknown, unknown>) => f.extensions as PothosExtensions;
const scopesOf = (f: GraphQLField<unknown, unknown>) => ext(f).pothosOptions?.authScopes;

describe("auth on the field", () => {
  it("finds the root fields", () => {
    expect(fields.length).toBeGreaterThan(50);
  });

  it("every root field declares who may call it", () => {
    expect(fields.filter(({ field }) => !scopesOf(field)).map((f) => f.name)).toEqual([]);
  });

  it("only the listed fields are public", () => {
    const open = fields.filter(({ field }) => {
      const scopes = scopesOf(field);
      return typeof scopes !== "object" || scopes === null || scopes.public === true;
    });
    expect(open.map((f) => f.name).sort()).toEqual([...PUBLIC].sort());
  });

  it("every declaration is enforced: before the resolver, and for subscriptions before subscribing", () => {
    const unchecked = fields.filter(({ root, field }) => !(root === "Subscription" ? ext(field).pothosSubscribeWrapped : ext(field).pothosResolveWrapped));
    expect(unchecked.map((f) => f.name)).toEqual([]);
  });
});
