import { z } from "zod";
import { hostCommand } from "./host.ts";

/**
 * The pub/sub channels and their payloads: the one typed map every publisher and subscriber goes through.
 * Messages are hints that something committed; the event table stays the source of truth, so a lost message
 * delays a subscriber (each server also polls the table) and never loses an event.
 */
/** An instance event committed; `cursor` is its position in commit order (core/instances/events.ts). */
const instanceEvent = z.object({
  cursor: z.string(),
  instanceId: z.string(),
  tenantId: z.string(),
  poolId: z.string(),
  projectId: z.string().nullable(),
  fromState: z.string().nullable(),
  toState: z.string(),
  version: z.number().int(),
});

export const channels = {
  /**
   * The instance events one write committed, in position order: one message per write (a create's three steps
   * are one PUBLISH, and one message for every process subscribed, not three).
   */
  instanceEvents: z.object({ events: z.array(instanceEvent) }),
  /** A node's desired set changed; keyed by node id, so each agent hears only its own. */
  nodeSpecs: z.object({ nodeId: z.string(), generation: z.number().int() }),
  /**
   * A node has new host commands; keyed by node id like its specs. They ride along, so the node's stream hands
   * them to its agent without reading them back (a warm claim's resume waits on this); a message without them
   * makes the stream read the node's unfinished commands.
   */
  hostCommands: z.object({ nodeId: z.string(), commands: z.array(hostCommand).optional() }),
  /** An exec command has new output or finished; keyed by command id, so only its watchers hear. */
  execOutput: z.object({ commandId: z.string() }),
  /** A credential stopped being valid (`tok:<id>`, `node:<id>`): connections authenticated by it are closed. */
  credentialsRevoked: z.object({ key: z.string() }),
} as const;
export type Channels = { [K in keyof typeof channels]: z.infer<(typeof channels)[K]> };
export type InstanceEventMessage = z.infer<typeof instanceEvent>;
