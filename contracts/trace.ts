import { channel } from "node:diagnostics_channel";

/**
 * Named points on the path of a write and of a host command, published on one Node diagnostics channel, so a
 * bench or a tracer (an OpenTelemetry instrumentation subscribes to such channels) can tell where the time
 * between a request and the host's answer went: the server's writes, the command leaving for the host, the
 * agent taking it and sending its report. Free while nobody subscribes. Shared by the server and the agent, which
 * publish the same shape; `at` is performance.now() of the publishing process.
 */
export const TRACE_CHANNEL = "bc:trace";

export type TracePointName =
  /** A write (one transaction) begins; `detail` is its action (a mutation's name), or its actor where it has none. */
  | "write.begin"
  /** It committed; hosts have been told of its commands and specs. */
  | "write.committed"
  /** Its events are positioned and published, its jobs enqueued. */
  | "write.applied"
  /** The server hands a command to its node's stream; `detail` is the command's kind and id. */
  | "command.sent"
  /** The agent took a command from the server; `detail` is its kind and id. */
  | "agent.command"
  /** The agent sends a command's report; `detail` is its state and the command's id. */
  | "agent.report";

export interface TracePoint {
  point: TracePointName;
  detail: string;
  at: number;
}

const trace = channel(TRACE_CHANNEL);

export function tracePoint(point: TracePointName, detail: string): void {
  if (trace.hasSubscribers) trace.publish({ point, detail, at: performance.now() } satisfies TracePoint);
}
