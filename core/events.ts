import { z } from "zod";
import type { Tx } from "./db.ts";

/**
 * The pub/sub channels and their payloads: the one typed map every publisher and subscriber goes through.
 * Messages are thin pointers at the event table, which stays the source of truth for resuming subscribers.
 */
export const channels = {
  instanceEvents: z.object({
    cursor: z.string(),
    instanceId: z.string(),
    tenantId: z.string(),
    poolId: z.string(),
    projectId: z.string().nullable(),
    fromState: z.string().nullable(),
    toState: z.string(),
    version: z.number().int(),
  }),
} as const;
export type Channels = { [K in keyof typeof channels]: z.infer<(typeof channels)[K]> };
export type InstanceEventMessage = Channels["instanceEvents"];

export interface EventSubject {
  id: string;
  tenantId: string;
  poolId: string;
  projectId: string | null;
  state: string;
  desiredState: string;
  version: number;
}

/** Write the event row of one instance version; the caller has already bumped `version`. */
export async function recordEvent(
  tx: Tx,
  inst: EventSubject,
  change: { from: string | null; reason: string; actor: string; at: Date },
): Promise<InstanceEventMessage> {
  const row = await tx.instanceEvent.create({
    data: {
      instanceId: inst.id,
      tenantId: inst.tenantId,
      poolId: inst.poolId,
      projectId: inst.projectId,
      fromState: change.from,
      toState: inst.state,
      desiredState: inst.desiredState,
      reason: change.reason,
      actor: change.actor,
      version: inst.version,
      at: change.at,
    },
    select: { id: true },
  });
  return {
    cursor: row.id.toString(),
    instanceId: inst.id,
    tenantId: inst.tenantId,
    poolId: inst.poolId,
    projectId: inst.projectId,
    fromState: change.from,
    toState: inst.state,
    version: inst.version,
  };
}
