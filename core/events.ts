import { z } from "zod";

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
  /** A node's desired set changed; keyed by node id, so each agent hears only its own. */
  nodeSpecs: z.object({ nodeId: z.string(), generation: z.number().int() }),
} as const;
export type Channels = { [K in keyof typeof channels]: z.infer<(typeof channels)[K]> };
export type InstanceEventMessage = Channels["instanceEvents"];
