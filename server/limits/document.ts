import { EnvelopArmor } from "@escape.tech/graphql-armor";
import { GraphQLError, NoSchemaIntrospectionCustomRule, type ValidationContext } from "graphql";
import type { Plugin } from "graphql-yoga";
import type { Config } from "../../infra/config.ts";

/**
 * Limits on the shape of a document, checked while it is parsed and validated, before anything runs: tokens,
 * depth, aliases and directives (GraphQL Armor). For anonymous callers outside development, introspection is
 * refused and validation errors do not suggest field names.
 */

type Limits = Config["limits"];

/** A refusal names the limit and the setting that raises it. */
export const limitError = (what: string, setting: keyof Limits) =>
  new GraphQLError(`${what} (the server's limits.${setting})`, { extensions: { code: "INVALID_INPUT", limit: setting } });

const armorsWords = (e: GraphQLError) => e.message.replace(/^Syntax Error: /, "").replace(/\.$/, "");

/** Armor's rules report through the validation context, so every limit a document breaks is listed at once. */
const reportAs =
  (setting: keyof Limits) =>
  (ctx: ValidationContext | null, e: GraphQLError): void => {
    const err = limitError(armorsWords(e), setting);
    // Token counting happens while parsing, where there is no validation context: the parse fails with ours.
    if (!ctx) throw err;
    ctx.reportError(err);
  };

/** Whether the request carries a credential (checked once it runs: a wrong one is UNAUTHENTICATED there). */
export function hasCredential(context: unknown): boolean {
  const c = context as { request?: Request; connectionParams?: Record<string, unknown> } | undefined;
  return Boolean(c?.request?.headers.get("authorization") ?? c?.connectionParams?.authorization);
}

export function documentLimits(limits: Limits, opts: { dev: boolean }): Plugin[] {
  const rejecting = (setting: keyof Limits) => ({ onReject: [reportAs(setting)], propagateOnRejection: false });
  const armor = new EnvelopArmor({
    maxTokens: { n: limits.tokens, ...rejecting("tokens") },
    maxDepth: { n: limits.depth, ...rejecting("depth") },
    maxAliases: { n: limits.aliases, ...rejecting("aliases") },
    maxDirectives: { n: limits.directives, ...rejecting("directives") },
    // The cost budget counts what lists hold, which Armor's cost limit does not: server/limits/request.ts.
    costLimit: { enabled: false },
    blockFieldSuggestion: { enabled: false },
  }).protect().plugins as Plugin[];
  if (opts.dev) return armor;
  const [hideSuggestions] = new EnvelopArmor({
    blockFieldSuggestion: { enabled: true, mask: "" },
    maxTokens: { enabled: false },
    maxDepth: { enabled: false },
    maxAliases: { enabled: false },
    maxDirectives: { enabled: false },
    costLimit: { enabled: false },
  }).protect().plugins as [Plugin];
  // The schema is no secret (schema.graphql is published with the SDK), but anonymous callers are the ones a
  // scanner is: they get neither introspection nor hints at names. Any credential brings both back.
  const anonymousOnly: Plugin = {
    onValidate: (payload) => {
      if (hasCredential(payload.context)) return;
      payload.addValidationRule(NoSchemaIntrospectionCustomRule);
      return hideSuggestions.onValidate?.(payload);
    },
  };
  return [...armor, anonymousOnly];
}
