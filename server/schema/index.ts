import { lexicographicSortSchema, printSchema } from "graphql";
import { builder } from "./builder.ts";
import "./viewer.ts";
import "./tenants.ts";
import "./pools.ts";
import "./providers.ts";
import "./images.ts";
import "./flavors.ts";
import "./instances.ts";
import "./hosts.ts";
import "./snapshots.ts";
import "./sandboxes.ts";
import "./sandbox-live.ts";
import "./sandbox-snapshots.ts";
import "./events.ts";
import "./doctor.ts";
import "./usage.ts";

export const schema = builder.toSchema();

/** What `schema.graphql` holds; sorted so that the committed file changes only when the API does. */
export const printedSchema = () => `${printSchema(lexicographicSortSchema(schema))}\n`;
