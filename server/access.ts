import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { type DocumentNode, getOperationAST } from "graphql";
import type { Plugin } from "graphql-yoga";
import type { Principal } from "../core/auth/principal.ts";
import type { Logger } from "../infra/log.ts";

/**
 * Request ids and access lines (docs/architecture.md, Logging). Every HTTP request gets an id — the caller's
 * `x-request-id` when it is well formed, else a new one — sent back in `x-request-id`, bound to the request's
 * logger (the GraphQL context's `log`), written to its audit row, and on the one access line logged when the
 * response ends. Websocket operations are logged as they start and end, by connection and operation id.
 */

/** What one HTTP request is, filled in as the server understands it, for its access line. */
export interface RequestScope {
  readonly id: string;
  readonly log: Logger;
  operation?: { name: string; type: string };
  principal?: Principal | null;
  /** The error code of a GraphQL request refused or failed (its HTTP status is often 200 all the same). */
  code?: string;
}

/** A caller's id goes into every log line and audit row: short, and nothing a log reader could be fooled by. */
const WELL_FORMED = /^[A-Za-z0-9._:-]{1,128}$/;

/** The caller's id if it is one well-formed header (repeated headers arrive joined by ", "), else a new one. */
export function requestIdOf(header: string | string[] | undefined): string {
  return typeof header === "string" && WELL_FORMED.test(header) ? header : randomUUID();
}

/** Who called, for a log line: the kind of credential and its tenant or node, never the credential itself. */
export function callerFields(p: Principal | null | undefined): Record<string, unknown> {
  if (!p) return { principal: "anonymous" };
  if (p.nodeId) return { principal: "node", nodeId: p.nodeId };
  if (p.operator) return { principal: "operator" };
  return { principal: "tenant", tenantId: p.tenantId };
}

export function operationOf(document: DocumentNode, operationName: string | null | undefined): { name: string; type: string } | undefined {
  const op = getOperationAST(document, operationName);
  return op ? { name: operationName ?? op.name?.value ?? "anonymous", type: op.operation } : undefined;
}

/** Probes and scrapes come every few seconds: their lines are debug, so they do not bury the traffic. */
const QUIET = new Set(["/healthz", "/readyz", "/metrics"]);

type Handler = (req: IncomingMessage, res: ServerResponse, scope: RequestScope) => Promise<void>;

/** The server's request handler with an id and an access line around it. */
export function withAccessLog(log: Logger, handler: Handler): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    const start = performance.now();
    const id = requestIdOf(req.headers["x-request-id"]);
    const scope: RequestScope = { id, log: log.child({ requestId: id }) };
    res.setHeader("x-request-id", id);
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    // "close" comes for a finished response and for one the client gave up on (then it says aborted).
    res.once("close", () => {
      const line = {
        method: req.method,
        path,
        status: res.statusCode,
        ms: Math.round((performance.now() - start) * 10) / 10,
        ...(res.writableFinished ? {} : { aborted: true }),
        ...(scope.operation ? { operation: scope.operation.name, operationType: scope.operation.type } : {}),
        ...(scope.code ? { code: scope.code } : {}),
        ...(scope.principal !== undefined ? callerFields(scope.principal) : {}),
      };
      (QUIET.has(path) ? scope.log.debug : scope.log.info)("request", line);
    });
    handler(req, res, scope).catch((e) => {
      scope.log.error("request failed", { err: e instanceof Error ? (e.stack ?? e.message) : String(e) });
      if (!res.headersSent) res.writeHead(500, { "content-type": "text/plain" }).end(`internal error (request ${id})\n`);
      else res.destroy();
    });
  };
}

/** The first error's code, for the access line (the context carries the scope of an HTTP request). */
export function noteCode(context: unknown, errors: readonly { extensions?: Record<string, unknown> }[] | undefined): void {
  const scope = (context as { scope?: RequestScope }).scope;
  const code = errors?.[0]?.extensions?.code;
  if (scope && typeof code === "string") scope.code ??= code;
}

/** Names the GraphQL operation on the request's scope once its document is known, valid or not. */
export const operationOnScope: Plugin<{ scope?: RequestScope; params?: { operationName?: string | null } }> = {
  onValidate: ({ params, context }) => {
    if (context.scope) context.scope.operation = operationOf(params.documentAST, context.params?.operationName);
    return ({ result }) => {
      if (result.length && context.scope) context.scope.code ??= "INVALID_INPUT";
    };
  },
};

/** One websocket's log lines: each carries its connection id; each operation's start and end carry its id too. */
export class SocketLog {
  readonly log: Logger;
  private readonly operations = new Map<string, { log: Logger; start: number }>();

  constructor(log: Logger) {
    this.log = log.child({ connectionId: randomUUID() });
  }

  /** The logger of an operation that passed validation (its context's `log`), after logging that it started. */
  started(operationId: string, requestId: string, op: { name: string; type: string } | undefined, principal: Principal | null): Logger {
    const log = this.log.child({ operationId, requestId });
    this.operations.set(operationId, { log, start: performance.now() });
    log.info("subscribe", { ...(op ? { operation: op.name, operationType: op.type } : {}), ...callerFields(principal) });
    return log;
  }

  /** graphql-ws says so for every started operation: it ended, the client completed it, or the socket closed. */
  completed(operationId: string): void {
    const o = this.operations.get(operationId);
    if (!o) return;
    this.operations.delete(operationId);
    o.log.info("complete", { ms: Math.round(performance.now() - o.start) });
  }
}
