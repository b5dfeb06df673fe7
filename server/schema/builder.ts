import SchemaBuilder from "@pothos/core";
import { GraphQLError, Kind } from "graphql";
import type { Context } from "../context.ts";

export const builder = new SchemaBuilder<{
  Context: Context;
  DefaultFieldNullability: false;
  Scalars: {
    DateTime: { Input: Date; Output: Date };
    JSON: { Input: unknown; Output: unknown };
  };
}>({ defaultFieldNullability: false });

builder.queryType({});
builder.mutationType({});
builder.subscriptionType({});

builder.scalarType("DateTime", {
  description: "An instant, as an ISO 8601 string in UTC.",
  serialize: (d) => (d instanceof Date ? d.toISOString() : String(d)),
  parseValue: (v) => {
    const d = new Date(String(v));
    if (typeof v !== "string" || Number.isNaN(d.getTime()))
      throw new GraphQLError("DateTime must be an ISO 8601 string", { extensions: { code: "INVALID_INPUT" } });
    return d;
  },
  parseLiteral: (ast) => {
    if (ast.kind !== Kind.STRING || Number.isNaN(new Date(ast.value).getTime()))
      throw new GraphQLError("DateTime must be an ISO 8601 string", { extensions: { code: "INVALID_INPUT" } });
    return new Date(ast.value);
  },
});

builder.scalarType("JSON", {
  description: "Any JSON value.",
  serialize: (v) => v,
  parseValue: (v) => v,
});

/** Resources by GPU model, used by flavors, quota and node capacity. */
export const GpuCount = builder.objectRef<{ model: string; count: number }>("GpuCount").implement({
  fields: (t) => ({ model: t.exposeString("model"), count: t.exposeInt("count") }),
});

export const GpuCountInput = builder.inputType("GpuCountInput", {
  fields: (t) => ({ model: t.string({ required: true }), count: t.int({ required: true }) }),
});

export const Resources = builder
  .objectRef<{ vcpus: number; memoryMib: number; diskGib: number; gpus: { model: string; count: number }[] }>("Resources")
  .implement({
    fields: (t) => ({
      vcpus: t.exposeInt("vcpus"),
      memoryMib: t.exposeInt("memoryMib"),
      diskGib: t.exposeInt("diskGib"),
      gpus: t.field({ type: [GpuCount], resolve: (r) => r.gpus }),
    }),
  });
