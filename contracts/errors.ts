/** The codes clients may branch on (a public contract); anything else reaches them as INTERNAL. */
export const errorCodes = [
  "INVALID_INPUT",
  "INVALID_CONFIG",
  "UNAUTHENTICATED",
  "FORBIDDEN",
  "NOT_FOUND",
  "CONFLICT",
  "QUOTA_EXCEEDED",
  "UNSCHEDULABLE",
  "UNSUPPORTED",
  "PRECONDITION_FAILED",
  "RATE_LIMITED",
] as const;
export type ErrorCode = (typeof errorCodes)[number];

// A registry symbol, not `instanceof`: a test runner or a bundler may load this module twice, and an error
// thrown by one copy must still be recognised by the other.
const brand = Symbol.for("better-compute.AppError");

export class AppError extends Error {
  readonly [brand] = true;
  readonly code: ErrorCode;
  readonly details: Record<string, unknown>;
  constructor(code: ErrorCode, message: string, details: Record<string, unknown> = {}) {
    super(message);
    this.name = "AppError";
    this.code = code;
    this.details = details;
  }
}

export const invalid = (message: string, details?: Record<string, unknown>) => new AppError("INVALID_INPUT", message, details);
export const notFound = (what: string, id: string) => new AppError("NOT_FOUND", `${what} ${id} not found`, { id });
export const forbidden = (message: string) => new AppError("FORBIDDEN", message);

export function isAppError(e: unknown, code?: ErrorCode): e is AppError {
  return typeof e === "object" && e !== null && (e as { [brand]?: boolean })[brand] === true && (code === undefined || (e as AppError).code === code);
}
