import { GraphQLError } from "graphql";
import { isAppError } from "../contracts/errors.ts";
import type { Logger } from "../infra/log.ts";

// Structural checks rather than `instanceof GraphQLError`: graphql ships CJS and ESM builds, and a process
// may load both (test runners do), each with its own GraphQLError class.
type GraphQLErrorLike = Error & { originalError?: unknown; path?: readonly (string | number)[]; extensions?: Record<string, unknown> };
const isGraphQLErrorLike = (e: unknown): e is GraphQLErrorLike => e instanceof Error && "extensions" in e && "path" in e;

/** SQLSTATEs of values the database refuses to store: bad characters, numbers out of range, untranslatable text. */
const UNSTORABLE = new Set(["22021", "22P05", "22003", "22P02"]);

/**
 * Turn what a resolver threw into what a client may see: an AppError keeps its code and details; a unique
 * key violation is a CONFLICT; anything else is logged and returned as INTERNAL naming the request id. `log` is
 * the request's own logger, whose lines already carry that id.
 */
export function toClientError(error: unknown, log: Logger, requestId: string): GraphQLError {
  const original = isGraphQLErrorLike(error) ? (error.originalError ?? error) : error;
  const path = isGraphQLErrorLike(error) ? error.path : undefined;
  if (isAppError(original)) {
    return new GraphQLError(original.message, { path, extensions: { ...original.details, code: original.code } });
  }
  if (isGraphQLErrorLike(original) && typeof original.extensions?.code === "string") {
    return new GraphQLError(original.message, { path, extensions: original.extensions });
  }
  // graphql's own errors outside any resolver (variable coercion: an unknown enum value, a missing field).
  if (isGraphQLErrorLike(original) && !path) return asInvalidInput(original);
  const sqlState = (original as { code?: unknown })?.code;
  // A unique key another request took between our check and our insert.
  if (sqlState === "23505") return new GraphQLError("already exists", { path, extensions: { code: "CONFLICT" } });
  // A value the database cannot hold (a NUL character in text, a number out of range): the caller's input,
  // refused by the database before anything was written.
  if (typeof sqlState === "string" && UNSTORABLE.has(sqlState)) {
    return new GraphQLError(`a value in the request cannot be stored: ${(original as Error).message}`, { path, extensions: { code: "INVALID_INPUT" } });
  }
  if (original instanceof Error && original.name === "IllegalTransition") {
    return new GraphQLError(original.message, { path, extensions: { code: "PRECONDITION_FAILED" } });
  }
  log.error("unexpected error", { err: original instanceof Error ? (original.stack ?? original.message) : String(original) });
  return new GraphQLError(`internal error (request ${requestId})`, { path, extensions: { code: "INTERNAL", requestId } });
}

/** Errors GraphQL itself raises about a request (unknown enum value, missing field) are bad input too. */
export function asInvalidInput(e: Error): GraphQLError {
  const g = e as GraphQLErrorLike & Partial<GraphQLError>;
  if (typeof g.extensions?.code === "string") return e as GraphQLError;
  return new GraphQLError(e.message, {
    nodes: g.nodes,
    source: g.source,
    positions: g.positions,
    path: g.path,
    extensions: { ...g.extensions, code: "INVALID_INPUT" },
  });
}
