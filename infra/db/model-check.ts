import type { ApiToken } from "../../core/auth/tokens.ts";
import type { Flavor } from "../../core/catalog/flavors.ts";
import type { Image } from "../../core/catalog/images.ts";
import type { HostCommandRow } from "../../core/commands/commands.ts";
import type { Instance } from "../../core/instances/model.ts";
import type { Snapshot } from "../../core/lifecycle/snapshots.ts";
import type { Pool } from "../../core/pools/driver.ts";
import type { Node } from "../../core/pools/hosted/nodes.ts";
import type { ProviderAccount } from "../../core/pools/provider/accounts.ts";
import type { Project } from "../../core/tenancy/projects.ts";
import type { Tenant } from "../../core/tenancy/tenants.ts";
import type * as Row from "../../prisma/generated/client.ts";

/**
 * The domain's row types against the data model (prisma/schema.prisma), checked by the compiler: `core` reads
 * rows in its own types with hand-written column lists, and this is where a renamed or added column shows up
 * as a type error instead of a field that silently reads as undefined. Nothing imports this file; `tsc` checks it.
 */

/** The fields `D` has that the table lacks, less those the domain derives on purpose. */
type Invented<D, M, Derived extends string = never> = Exclude<keyof D, keyof M | Derived>;
/** The columns the table has that `D` does not read, less those the domain leaves out on purpose. */
type Unread<D, M, Omitted extends string = never> = Exclude<keyof M, keyof D | Omitted>;
type None<K> = [K] extends [never] ? true : { missingOrExtra: K };

// Instances are read whole: every column, nothing else.
export const instance: [None<Invented<Instance, Row.Instance>>, None<Unread<Instance, Row.Instance>>] = [true, true];
export const snapshot: [None<Invented<Snapshot, Row.InstanceSnapshot>>, None<Unread<Snapshot, Row.InstanceSnapshot>>] = [true, true];
export const command: [None<Invented<HostCommandRow, Row.HostCommand>>, None<Unread<HostCommandRow, Row.HostCommand>>] = [true, true];
export const flavor: [None<Invented<Flavor, Row.Flavor>>, None<Unread<Flavor, Row.Flavor>>] = [true, true];
export const tenant: [None<Invented<Tenant, Row.Tenant>>, None<Unread<Tenant, Row.Tenant>>] = [true, true];
export const project: [None<Invented<Project, Row.Project>>, None<Unread<Project, Row.Project>>] = [true, true];
export const account: [None<Invented<ProviderAccount, Row.ProviderAccount>>, None<Unread<ProviderAccount, Row.ProviderAccount>>] = [true, true];
// The rest leave out what no reader needs (secrets' hashes, soft-delete marks) or derive fields from columns.
export const pool = [true, true] satisfies [None<Invented<Pool, Row.Pool, "singleTenant">>, None<Unread<Pool, Row.Pool, "policy">>];
export const node = [true, true] satisfies [None<Invented<Node, Row.Node, "gpus">>, None<Unread<Node, Row.Node, "credentialHash" | "dedicatedTenantId">>];
export const image = [true, true] satisfies [None<Invented<Image, Row.Image>>, None<Unread<Image, Row.Image, "deletedAt">>];
export const apiToken = [true, true] satisfies [None<Invented<ApiToken, Row.ApiToken>>, None<Unread<ApiToken, Row.ApiToken, "tokenHash">>];
