import { GraphQLError } from "graphql";
import { AppError } from "../core/errors.ts";
import { IllegalTransition } from "../core/state.ts";
import type { Logger } from "../infra/log.ts";

/**
 * Turn what a resolver threw into what a client may see: an AppError keeps its code and details; a unique
 * key violation is a CONFLICT; anything else is logged with the request id and returned as INTERNAL.
 */
export function toClientError(error: unknown, log: Logger, requestId: string): GraphQLError {
  const original = error instanceof GraphQLError ? (error.originalError ?? error) : error;
  const path = error instanceof GraphQLError ? error.path : undefined;
  if (original instanceof AppError) {
    return new GraphQLError(original.message, { path, extensions: { ...original.details, code: original.code } });
  }
  if (original instanceof GraphQLError && typeof original.extensions?.code === "string") return original;
  const prismaCode = (original as { code?: unknown })?.code;
  if (prismaCode === "P2002") return new GraphQLError("already exists", { path, extensions: { code: "CONFLICT" } });
  if (original instanceof IllegalTransition) {
    return new GraphQLError(original.message, { path, extensions: { code: "PRECONDITION_FAILED" } });
  }
  log.error("unexpected error", { requestId, err: original instanceof Error ? (original.stack ?? original.message) : String(original) });
  return new GraphQLError(`internal error (request ${requestId})`, { path, extensions: { code: "INTERNAL", requestId } });
}

/** Errors GraphQL itself raises about a request (unknown enum value, missing field) are bad input too. */
export const asInvalidInput = (e: Error): GraphQLError =>
  !(e instanceof GraphQLError)
    ? new GraphQLError(e.message, { extensions: { code: "INVALID_INPUT" } })
    : e.extensions?.code
      ? e
      : new GraphQLError(e.message, {
          nodes: e.nodes,
          source: e.source,
          positions: e.positions,
          path: e.path,
          extensions: { ...e.extensions, code: "INVALID_INPUT" },
        });
