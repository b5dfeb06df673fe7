import type { ObjectRef, SchemaTypes } from "@pothos/core";
import { builder } from "./builder.ts";

/**
 * The API's one way to page a list: `first` and `after` in, a `<Name>Connection` of `edges` (cursor, node), `nodes`
 * and `pageInfo` out, each cursor opaque and made by core/ (keyset: pages stay stable under inserts). A new paged
 * list takes `pageArgs`, `pageCost` and `connection(…)` from here. (`sandboxes(first, after)` predates this and
 * returns a plain list; its shape is public.)
 */
export interface Page<T> {
  edges: { cursor: string; node: T }[];
  pageInfo: { hasNextPage: boolean; endCursor: string | null };
}

const PageInfo = builder.objectRef<Page<unknown>["pageInfo"]>("PageInfo").implement({
  fields: (t) => ({ hasNextPage: t.exposeBoolean("hasNextPage"), endCursor: t.exposeString("endCursor", { nullable: true }) }),
});

export const pageArgs = builder.args((t) => ({
  first: t.int({ description: "Page size, 1 to 500 (default 50)." }),
  after: t.string(),
}));

/** A page costs the budget (server/limits/) its size: counted once here, so its edges and nodes count each item once. */
export const pageCost = (args: { first?: number | null }) => ({ multiplier: args.first ?? 50 });

export function connection<Types extends SchemaTypes, T>(name: string, node: ObjectRef<Types, T>) {
  // `as never`: Pothos cannot see through a generic node type that a T is what its field resolves to.
  const Edge = builder.objectRef<Page<T>["edges"][number]>(`${name}Edge`).implement({
    fields: (t) => ({ cursor: t.exposeString("cursor"), node: t.field({ type: node, resolve: (e) => e.node as never }) }),
  });
  return builder.objectRef<Page<T>>(`${name}Connection`).implement({
    fields: (t) => ({
      edges: t.field({ type: [Edge], complexity: { multiplier: 1 }, resolve: (c) => c.edges }),
      nodes: t.field({ type: [node], complexity: { multiplier: 1 }, resolve: (c) => c.edges.map((e) => e.node) }),
      pageInfo: t.field({ type: PageInfo, resolve: (c) => c.pageInfo }),
    }),
  });
}
