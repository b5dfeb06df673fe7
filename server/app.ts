import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { type ExecutionResult, GraphQLError } from "graphql";
import { useServer } from "graphql-ws/use/ws";
import { createYoga, type Plugin } from "graphql-yoga";
import { WebSocketServer } from "ws";
import { AppError, isAppError } from "../contracts/errors.ts";
import { authenticate, isOperatorToken } from "../core/auth/authenticate.ts";
import type { Principal } from "../core/auth/principal.ts";
import { pendingMigrations } from "../infra/db/migrate.ts";
import type { Platform } from "../infra/platform.ts";
import { noteCode, operationOf, operationOnScope, type RequestScope, SocketLog, withAccessLog } from "./access.ts";
import { bodyAllowed } from "./body.ts";
import type { Context } from "./context.ts";
import { dashboard, defaultDashboardDir } from "./dashboard.ts";
import { asInvalidInput, toClientError } from "./errors.ts";
import type { AuthFailures } from "./limits/auth-failures.ts";
import { credentialChecker, openLimits, overLimit } from "./limits/index.ts";
import { callerKey } from "./limits/request.ts";
import { type OpenSources, subscribeShared } from "./live/execute.ts";
import { CloseCode, closeReason, type LiveConnection, LiveHub } from "./live/hub.ts";
import { serverMetrics } from "./metrics.ts";
import { PrincipalCache } from "./principal-cache.ts";
import { schema } from "./schema/index.ts";
import { serveUsageCsv } from "./usage-csv.ts";

export interface App {
  server: Server;
  url: string;
  hub: LiveHub;
  /** Subscriptions of every kind (instance events, node streams) whose source is still open. */
  liveOperations(): number;
  close(): Promise<void>;
}

/** Where a request comes from, for the limit on unknown tokens per source address (server/limits/auth-failures.ts). */
interface Origin {
  failures: AuthFailures;
  address: string | undefined;
}

/** Who `authorization` speaks for; through `cache` where given (requests), read every time where not (re-checks). */
async function principalFor(platform: Platform, authorization: string | undefined | null, cache?: PrincipalCache, origin?: Origin): Promise<Principal | null> {
  if (!authorization) return null;
  const bearer = /^Bearer\s+(\S+)$/i.exec(authorization)?.[1];
  const address = origin?.address;
  // An address that kept presenting tokens nobody issued gets no more reads: only what this server already knows.
  if (bearer && address && !cache?.knows(bearer, platform.now()) && !isOperatorToken(bearer, platform.operatorToken)) {
    const wait = origin.failures.blockedFor(address);
    if (wait > 0) {
      const seconds = Math.ceil(wait / 1000);
      throw new AppError(
        "RATE_LIMITED",
        `too many unknown, expired or revoked tokens from this address; retry in ${seconds} s (the server's limits.authFailures)`,
        {
          retryAfterMs: wait,
          limit: "authFailures",
          http: { status: 429, headers: { "Retry-After": String(seconds) } },
        },
      );
    }
  }
  const lookup = () => platform.read((sql) => authenticate(sql, bearer as string, platform.operatorToken, platform.now()));
  const who = bearer ? await (cache ? cache.principal(bearer, platform.now(), lookup) : lookup()) : null;
  // A credential that is wrong is an error, not an anonymous call: clients learn at once that it is bad.
  if (!who) {
    if (address) origin.failures.failed(address);
    throw new AppError("UNAUTHENTICATED", "the bearer token is unknown, expired or revoked");
  }
  return who;
}

/** Request-level input errors (validation, variable coercion) carry INVALID_INPUT like any other bad input. */
const invalidInputCodes: Plugin = {
  onValidate:
    () =>
    ({ result, setResult }) => {
      if (result.length) setResult(result.map(asInvalidInput));
    },
  onExecute: () => ({
    onExecuteDone: ({ result, setResult }) => {
      const r = result as ExecutionResult;
      if (r.errors?.length) setResult({ ...r, errors: r.errors.map((e) => (e.originalError ? e : asInvalidInput(e))) });
    },
  }),
};

/**
 * Yoga's own refusals of a request it cannot read (malformed JSON, a batch, a mutation over GET, a syntax error)
 * carry codes outside the contract (contracts/errors.ts): they are bad input, and say what was wrong with it.
 */
function withContractCode(e: GraphQLError): GraphQLError {
  const code = e.extensions?.code;
  if (code !== "BAD_REQUEST" && code !== "GRAPHQL_PARSE_FAILED") return e;
  const { originalError, ...extensions } = e.extensions as { originalError?: { message?: string } };
  const detail = originalError?.message ? `: ${originalError.message}` : "";
  const hint = /batch/i.test(e.message) ? " Send one operation per request." : "";
  return new GraphQLError(`${e.message.replace(/\.$/, "")}${detail}.${hint}`, { path: e.path, extensions: { ...extensions, code: "INVALID_INPUT" } });
}

/**
 * Ends a websocket that sends more than `bytes` before its credential is accepted, before ws has read a frame
 * that large: a 40 MiB connection_init would otherwise be buffered and parsed. Returns what lifts the bound.
 */
function boundBeforeAuth(raw: Socket, bytes: number): () => void {
  let seen = 0;
  const count = (chunk: Buffer) => {
    seen += chunk.length;
    if (seen > bytes) raw.destroy();
  };
  raw.on("data", count);
  return () => raw.off("data", count);
}

export async function startServer(platform: Platform, opts: { port?: number; host?: string } = {}): Promise<App> {
  const sources: OpenSources = { count: 0 };
  // A credential that no longer works is null; a database outage throws, and the hub keeps the connection.
  const hub = await LiveHub.start(platform, (bearer) =>
    principalFor(platform, `Bearer ${bearer}`).catch((e) => {
      if (isAppError(e, "UNAUTHENTICATED")) return null;
      throw e;
    }),
  );
  const limits = await openLimits(platform);
  const principals = PrincipalCache.open(platform, platform.config.limits.authCacheMs);
  const metrics = serverMetrics(platform, hub, () => sources.count);
  const clientError = (error: unknown, log: Platform["log"], requestId: string) =>
    overLimit(error, platform.config.limits) ?? withContractCode(toClientError(error, log, requestId));
  /** Execution errors are mapped where the request is known, so an unexpected one is logged under its request id. */
  const requestErrors: Plugin<Context> = {
    onExecute: ({ args }) => ({
      onExecuteDone: ({ result, setResult }) => {
        const r = result as ExecutionResult;
        if (!r.errors?.length) return;
        const errors = r.errors.map((e) => clientError(e, args.contextValue.log, args.contextValue.requestId));
        noteCode(args.contextValue, errors);
        setResult({ ...r, errors });
      },
    }),
  };
  const yoga = createYoga<{ scope?: RequestScope; req?: IncomingMessage }, Context>({
    schema,
    graphqlEndpoint: "/graphql",
    landingPage: false,
    // Bounded before yoga sees the request, more cheaply than yoga does it (server/body.ts).
    maxRequestBodySize: false,
    // GraphiQL is served by the dashboard's module, from files of our own (server/dashboard.ts).
    graphiql: false,
    plugins: [...limits.plugins, invalidInputCodes, requestErrors as Plugin, operationOnScope as Plugin, metrics.plugin],
    // Refusals are answers, not faults: yoga's own logging would print each one; ours logs the unexpected.
    logging: {
      debug: () => {},
      info: () => {},
      warn: (...a: unknown[]) => platform.log.warn(String(a[0])),
      error: (...a: unknown[]) => platform.log.debug(String(a[0])),
    },
    context: async ({ request, scope, req }) => {
      const requestId = scope?.id ?? randomUUID();
      const log = scope?.log ?? platform.log.child({ requestId });
      // Websocket operations have no HTTP request: onSubscribe below authenticates from connectionParams.
      if (!request) return { platform, principal: null, requestId, log };
      const authorization = request.headers.get("authorization");
      try {
        const origin = { failures: limits.authFailures, address: req?.socket.remoteAddress };
        const principal = await principalFor(credentialChecker(platform, authorization), authorization, principals, origin);
        if (scope) scope.principal = principal;
        return { platform, principal, requestId, log };
      } catch (e) {
        const error = isAppError(e) ? e : clientError(e, log, requestId);
        if (scope) scope.code = isAppError(error) ? error.code : "INTERNAL";
        throw error;
      }
    },
    maskedErrors: {
      // The net for errors raised outside execution: what the plugin above mapped passes through unchanged.
      maskError: (error) => {
        const requestId = ((error as GraphQLError).extensions?.requestId as string | undefined) ?? randomUUID();
        return clientError(error, platform.log.child({ requestId }), requestId);
      },
    },
  });

  const site = dashboard(platform.config.dashboardDir ?? defaultDashboardDir);
  const handle = async (req: IncomingMessage, res: ServerResponse, scope: RequestScope) => {
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    if (path === "/healthz") return void res.writeHead(200, { "content-type": "text/plain" }).end("ok\n");
    if (path === "/readyz") {
      // Ready: the database answers and has every migration this build knows, and the bus (Redis) answers.
      const checks: Record<string, string> = {};
      const check = async (name: string, probe: () => Promise<string | null>) => {
        try {
          checks[name] = (await probe()) ?? "ok";
        } catch (e) {
          checks[name] = `unavailable: ${e instanceof Error ? e.message : String(e)}`;
        }
      };
      await Promise.all([
        check("database", async () => {
          const pending = await platform.read((sql) => pendingMigrations(sql));
          return pending.length ? `migrations not applied: ${pending.join(", ")}` : null;
        }),
        check("bus", async () => {
          await platform.bus.ping();
          return null;
        }),
      ]);
      const ready = Object.values(checks).every((v) => v === "ok");
      return void res.writeHead(ready ? 200 : 503, { "content-type": "application/json" }).end(`${JSON.stringify({ ready, ...checks })}\n`);
    }
    if (path === "/metrics") {
      try {
        const text = await metrics.render();
        return void res.writeHead(200, { "content-type": metrics.contentType }).end(text);
      } catch (e) {
        platform.log.warn("metrics could not be gathered", { err: String(e) });
        return void res.writeHead(503, { "content-type": "text/plain" }).end("metrics unavailable\n");
      }
    }
    if (path === "/usage.csv" && req.method === "GET")
      return serveUsageCsv(platform, req, res, () =>
        principalFor(credentialChecker(platform, req.headers.authorization ?? null), req.headers.authorization, principals, {
          failures: limits.authFailures,
          address: req.socket.remoteAddress,
        }),
      );
    if (await site(req, res, path)) return;
    if (path === "/graphql" && req.method === "GET" && /text\/html/.test(req.headers.accept ?? "")) return site.graphiql(res, "/graphql");
    if (!bodyAllowed(req, res, platform.config.limits.bodyBytes)) return;
    return yoga.handle(req, res, { scope });
  };
  const server = createServer(withAccessLog(platform.log, handle));
  // Node drops a kept-alive connection idle for 5 s, so a client that acts every few seconds (a script between
  // steps, a dashboard between clicks) pays a new connection each time, and one behind a load balancer sees resets
  // when the balancer reuses a connection the server is closing. 65 s outlasts the usual balancer idle timeout;
  // the Keep-Alive header announces it, and Node's own clients (the SDK) keep theirs open that long.
  server.keepAliveTimeout = 65_000;

  // Subscriptions share the port: graphql-ws on the same path, executed through yoga's envelop (docs/architecture.md, Pitfalls).
  // A connection authenticates once, from connectionParams; the live hub ends it when that credential stops working.
  const live = new WeakMap<object, LiveConnection>();
  const socketLogs = new WeakMap<object, SocketLog>();
  // Frames up to the HTTP body limit; before its credential is accepted, a socket may send far less (below).
  const wss = new WebSocketServer({ server, path: "/graphql", maxPayload: platform.config.limits.bodyBytes });
  const preAuth = new WeakMap<object, () => void>();
  const ws = useServer(
    {
      onConnect: async (ctx) => {
        const socket = ctx.extra.socket;
        const slog = new SocketLog(platform.log);
        socketLogs.set(socket, slog);
        const auth = (ctx.connectionParams?.authorization as string | undefined) ?? null;
        const address = ctx.extra.request.socket.remoteAddress;
        let principal: Principal | null;
        const mark = hub.mark();
        try {
          principal = await principalFor(platform, auth, principals, { failures: limits.authFailures, address });
          // Revoked while it was being checked: the revocation could not end a connection not yet registered.
          const overtaken = hub.revokedSince(mark, principal);
          if (overtaken === "revoked") throw new AppError("UNAUTHENTICATED", "credential revoked");
          if (overtaken === "unsure") throw new Error("more revocations arrived during the check than the hub remembers");
        } catch (e) {
          // A bad credential is final (4401); not being able to check it (the database is down, or this address
          // is refused for a while) is not.
          if (isAppError(e, "UNAUTHENTICATED")) socket.close(CloseCode.unauthorized, "the bearer token is unknown, expired or revoked");
          else if (isAppError(e, "RATE_LIMITED")) socket.close(CloseCode.tryAgainLater, closeReason(e.message));
          else {
            slog.log.warn("could not authenticate a websocket", { err: String(e) });
            socket.close(CloseCode.tryAgainLater, "cannot check credentials right now; retry");
          }
          return false;
        }
        const full = limits.live.connection(hub, principal, address);
        if (full) {
          socket.close(CloseCode.tooMany, closeReason(full));
          return false;
        }
        preAuth.get(socket)?.();
        const bearer = auth ? (/^Bearer\s+(\S+)$/i.exec(auth)?.[1] ?? null) : null;
        const caller = principal?.nodeId ? null : callerKey(principal, address);
        const conn = hub.connect(socket, principal, bearer, { caller });
        live.set(socket, conn);
        // Straight from the socket: graphql-ws calls onClose only after every subscription has returned, and a
        // subscription waiting on a quiet instance or node returns only once its connection has ended.
        socket.once("close", () => conn.dropped());
        return true;
      },
      onClose: (ctx) => live.get(ctx.extra.socket)?.dropped(),
      onComplete: (ctx, id) => socketLogs.get(ctx.extra.socket)?.completed(id),
      execute: ((args: { rootValue: { execute: (a: unknown) => unknown } }) => args.rootValue.execute(args)) as never,
      // Subscriptions skip yoga's executor: events are resolved once per distinct request (server/live/execute.ts).
      // Subscriptions pay like queries: admitted (cost, rate, caps, lane) before their source opens.
      subscribe: async (args) => {
        const ctx = args.contextValue as Context;
        // Its own end, which its source stops on (queries and mutations over the socket end with the connection).
        if (ctx.live) Object.assign(ctx.live, ctx.live.conn.operation());
        const refused = await limits.live.subscription(args);
        if (refused) {
          ctx.live?.complete?.();
          return { errors: [refused] };
        }
        const mask = (r: ExecutionResult) => (r.errors?.length ? { ...r, errors: r.errors.map((e) => toClientError(e, ctx.log, ctx.requestId)) } : r);
        try {
          return await subscribeShared(args, ctx.principal?.identityId ?? "", mask, sources);
        } catch (e) {
          ctx.live?.complete?.();
          throw e;
        }
      },
      onSubscribe: async (ctx, id, payload) => {
        const {
          schema: s,
          execute,
          subscribe,
          contextFactory,
          parse,
          validate,
        } = yoga.getEnveloped({ ...ctx, req: ctx.extra.request, socket: ctx.extra.socket, params: payload });
        const conn = live.get(ctx.extra.socket);
        const requestId = randomUUID();
        const slog = socketLogs.get(ctx.extra.socket) ?? new SocketLog(platform.log);
        const contextValue: Context = {
          ...(await contextFactory()),
          platform,
          principal: conn?.principal ?? null,
          requestId,
          log: slog.log.child({ operationId: id, requestId }),
          ...(conn ? { live: { hub, conn, operationId: id, signal: conn.signal } } : {}),
        };
        const args = {
          schema: s,
          operationName: payload.operationName,
          document: parse(payload.query),
          variableValues: payload.variables,
          contextValue,
          rootValue: { execute, subscribe },
        };
        const errors = validate(args.schema, args.document);
        if (errors.length) return errors.map(asInvalidInput);
        contextValue.log = slog.started(id, requestId, operationOf(args.document, payload.operationName), contextValue.principal);
        return args;
      },
    },
    wss,
    platform.config.live.keepAliveMs,
  );
  // After graphql-ws's own listener, so that its handling of socket errors can be replaced: a frame over the
  // limit is the client's doing (ws answers 1009 and closes), not a fault to print on the console for each one.
  wss.on("connection", (socket, req) => {
    preAuth.set(socket, boundBeforeAuth(req.socket, platform.config.limits.wsPreAuthBytes));
    socket.removeAllListeners("error");
    socket.on("error", (err) => platform.log.debug("websocket error", { err: String(err) }));
    // A write to a socket the peer broke fails every frame still queued, and graphql-ws prints each failure with
    // its stack: a client that drops a connection with many subscriptions open would fill the log. The close
    // that follows ends the connection and its subscriptions; the failed frames themselves need no one told.
    const send = socket.send.bind(socket) as (data: string, done?: (err?: Error) => void) => void;
    socket.send = ((data: string, ...rest: unknown[]) => {
      const done = rest.find((r): r is (err?: Error) => void => typeof r === "function");
      send(data, (err) => {
        if (err) platform.log.debug("websocket write failed", { err: String(err) });
        done?.();
      });
    }) as typeof socket.send;
  });

  await new Promise<void>((resolve) => server.listen(opts.port ?? platform.config.port, opts.host ?? platform.config.host, resolve));
  const addr = server.address();
  const port = typeof addr === "object" && addr ? addr.port : opts.port;
  const host = opts.host ?? platform.config.host;
  return {
    server,
    url: `http://${host.includes(":") ? `[${host}]` : host}:${port}/graphql`,
    /**
     * Graceful stop: websocket clients are closed with "going away" (1001, which clients retry), idle keep-alive
     * connections at once, and requests still in flight get a few seconds before their connections are cut.
     */
    hub,
    liveOperations: () => sources.count,
    async close() {
      await hub.close();
      await ws.dispose();
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeIdleConnections();
        setTimeout(() => server.closeAllConnections(), 5000).unref();
      });
      await limits.close();
      await principals.close();
    },
  };
}
