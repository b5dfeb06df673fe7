/** A GraphQL error as the API reports it; `code` is its `extensions.code` (the API's error codes). */
export class SdkError extends Error {
  readonly code: string;
  readonly errors: { message: string; path?: (string | number)[]; extensions?: Record<string, unknown> }[];
  constructor(errors: SdkError["errors"], status?: number) {
    const first = errors[0];
    super(first ? `${first.extensions?.code ?? "ERROR"}: ${first.message}` : `HTTP ${status}`);
    this.name = "SdkError";
    this.code = String(first?.extensions?.code ?? (status ? `HTTP_${status}` : "UNKNOWN"));
    this.errors = errors;
  }
}
