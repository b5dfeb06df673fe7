import type { NetworkPolicy, ObservedState } from "../../contracts/host.ts";
import type { Charge, GpuClaim } from "../tenancy/quota.ts";
import type { DesiredState, InstanceState } from "./state.ts";

/** Why an instance is not where it should be (Unschedulable, RuntimeError, ProviderError). */
export interface Condition {
  type: string;
  reason: string;
  message: string;
}

/** An `instances` row, as the domain reads it. The data layer checks it against prisma/schema.prisma. */
export interface Instance {
  id: string;
  tenantId: string;
  poolId: string;
  projectId: string | null;
  ownerIdentityId: string;
  idempotencyKey: string;
  /** SHA-256 of the create request's inputs: a replay with other inputs is a CONFLICT. */
  requestHash: string;
  flavor: string;
  vcpus: number;
  memoryMib: number;
  diskGib: number;
  gpus: GpuClaim[];
  imageId: string;
  imageUrl: string | null;
  imageSha256: string | null;
  imageFormat: "raw" | "qcow2" | "iso" | null;
  imageVerified: boolean;
  sshKeys: string[];
  /** AES-256-GCM, bound to the instance id (core/kernel/seal.ts). */
  userDataSealed: Uint8Array | null;
  runtime: string | null;
  state: InstanceState;
  desiredState: DesiredState;
  nodeId: string | null;
  allocationId: string | null;
  externalId: string | null;
  /** Provider pools: the provider's machine type the flavor mapped to at admission. */
  offer: string | null;
  /** Provider pools: while a run creates the machine, no other run may (core/pools/provider/sync.ts). */
  createLeaseUntil: Date | null;
  addresses: string[];
  conditions: Condition[];
  /** Resource → amount charged to the tenant's quota while the instance is live. */
  charge: Charge;
  chargeReleased: boolean;
  /** The node's spec generation at this instance's last change: host reports older than it are stale. */
  specGeneration: number;
  /** The host's latest word on the domain; `absent` when a report no longer holds it. */
  observedState: ObservedState | "absent" | null;
  observedError: string | null;
  observedRetryable: boolean;
  observedShape: { vcpus: number; memoryMib: number; diskGib: number } | null;
  observedGeneration: number;
  observedAt: Date | null;
  /** Recreates so far, and the hosts that refused it. */
  attempts: number;
  excludedNodes: string[];
  retryRequested: boolean;
  /** Sandboxes: the sandbox this instance runs; the warm-pool template (and version) it was made for. */
  sandboxId: string | null;
  warmTemplateId: string | null;
  warmTemplateVersion: number | null;
  claimedAt: Date | null;
  /** The guest's environment and egress policy (sandboxes), as the host spec carries them. */
  env: Record<string, string>;
  networkPolicy: NetworkPolicy | null;
  /** Made from another instance's snapshot on the same host (a restored sandbox). */
  restoreFrom: { instanceId: string; snapshotId: string } | null;
  version: number;
  createdAt: Date;
  updatedAt: Date;
}

/** Selects an `instances` row as an Instance. */
export const INSTANCE_COLUMNS = `id, tenant_id AS "tenantId", pool_id AS "poolId", project_id AS "projectId",
  owner_identity_id AS "ownerIdentityId", idempotency_key AS "idempotencyKey", request_hash AS "requestHash",
  flavor, vcpus, memory_mib AS "memoryMib", disk_gib AS "diskGib", gpus, image_id AS "imageId",
  image_url AS "imageUrl", image_sha256 AS "imageSha256", image_format AS "imageFormat",
  image_verified AS "imageVerified", ssh_keys AS "sshKeys", user_data_sealed AS "userDataSealed", runtime,
  state, desired_state AS "desiredState", node_id AS "nodeId", allocation_id AS "allocationId",
  external_id AS "externalId", offer, create_lease_until AS "createLeaseUntil", addresses, conditions, charge, charge_released AS "chargeReleased", version,
  spec_generation AS "specGeneration", observed_state AS "observedState", observed_error AS "observedError",
  observed_retryable AS "observedRetryable", observed_shape AS "observedShape", observed_generation AS "observedGeneration",
  observed_at AS "observedAt", attempts, COALESCE(excluded_nodes, '{}') AS "excludedNodes", retry_requested AS "retryRequested",
  sandbox_id AS "sandboxId", warm_template_id AS "warmTemplateId", warm_template_version AS "warmTemplateVersion",
  claimed_at AS "claimedAt", env, network_policy AS "networkPolicy", restore_from AS "restoreFrom",
  created_at AS "createdAt", updated_at AS "updatedAt"`;
