import type { Principal } from "../../core/auth/principal.ts";
import { eventsHorizon } from "../../core/books/retention.ts";
import { type EventFilter, headPosition, readEvents, type WatchedEvent } from "../../core/instances/events.ts";
import type { Sql } from "../../core/kernel/db.ts";
import type { Platform } from "../../infra/platform.ts";
import type { Frames } from "./execute.ts";
import { EventFeed, type Sink } from "./feed.ts";

/**
 * Websocket close codes a client acts on. Clients retry all but `unauthorized`; a watcher resumes with the
 * cursor of the last event it saw (sdk/watch.ts does).
 */
export const CloseCode = {
  /** The server is stopping or restarting: reconnect (to any replica) and resume. */
  restart: 1012,
  /** The connection fell further behind than its buffer: reconnect and resume; nothing is lost. */
  slowConsumer: 4008,
  /** The credential expired or was revoked: retrying with it cannot succeed. */
  unauthorized: 4401,
  /** The server failed to turn an event into a message (a bug): reconnect and resume. */
  internalError: 1011,
  /** The server could not check the credential (its database is unreachable), or not now: retry later. */
  tryAgainLater: 1013,
  /** The credential holds as many connections as it may (limits.connectionsPerCaller): close one first. */
  tooMany: 4429,
} as const;

/** A close frame's reason holds at most 123 bytes (RFC 6455); ws throws on a longer one. */
export function closeReason(text: string): string {
  const bytes = Buffer.from(text);
  if (bytes.length <= 123) return text;
  // Cut on a character boundary: a partial UTF-8 sequence at the end would make the frame invalid.
  return new TextDecoder().decode(bytes.subarray(0, 120)).replace(/\uFFFD$/, "") + "...";
}

/** What the hub needs of a websocket (the `ws` library's). */
export interface Socket {
  close(code: number, reason: string): void;
  /** `done` is called once the frame is handed to the kernel (or failed to be). */
  send(frame: string, done: (err?: Error) => void): void;
  readonly readyState: number;
  /** Stop and start reading what the peer sends (the `ws` library's; absent in tests' stand-ins). */
  pause?(): void;
  resume?(): void;
}

/** The longest a refused connection is left unread: well under the keepalive, whose pong it would not read meanwhile. */
const MAX_HOLD_MS = 5000;

/** WebSocket readyState OPEN. */
const OPEN = 1;

/** Catch-up pages while a subscriber replays from its cursor: paced by the subscriber, so never counted as backlog. */
const PAGE = 500;
/** Events a replay sends per turn (200 replays of 500 sent at once held the event loop 600 ms). */
const REPLAY_TURN = 32;
/** Turns granted per pass of the event loop, over every replay of the server: about 64 events, a few ms. */
const TURNS_PER_PASS = 2;

export interface WatchOptions {
  /** Write the live tail straight to the socket as these frames. */
  frames?: Frames | undefined;
  replay?: Replay | undefined;
  /** The subscription's own end (LiveConnection.operation). */
  signal?: AbortSignal | undefined;
}

/** Whose connection it is, for the caps on what one caller holds open (server/limits/live.ts). */
export interface ConnectionInfo {
  /** Whose budget its operations spend (server/limits/request.ts, callerKey); null for a host's. */
  caller: string | null;
}

/**
 * How a subscription's replay is read and paid for: on its caller's lane, a page at a time, each page paid for
 * like a query of that many items before it is sent (server/limits/live.ts). Without it (tests, tools), pages
 * of PAGE on the hub's own platform.
 */
export interface Replay {
  read<T>(fn: (sql: Sql) => Promise<T>): Promise<T>;
  page: number;
  /** Resolves once `events` are paid for (waiting out the caller's rate limit), or once the connection has ended. */
  pay(events: number): Promise<void>;
}

/** One websocket: who it speaks for, and the backlog of all its subscriptions together. */
export class LiveConnection {
  queued = 0;
  readonly streams = new Set<EventStream>();
  /** One per open subscription: aborted when it completes, or when the connection ends. */
  private readonly operations = new Set<AbortController>();
  private expiry: NodeJS.Timeout | undefined;
  private holding: NodeJS.Timeout | undefined;
  private readonly ending = new AbortController();
  ended = false;

  constructor(
    readonly socket: Socket,
    readonly principal: Principal | null,
    /** The bearer, kept to re-check it (a revocation message can be lost). */
    readonly bearer: string | null,
    private readonly hub: LiveHub,
    readonly info: ConnectionInfo = { caller: null },
  ) {
    const at = principal?.credential?.expiresAt;
    // Timers hold at most ~24 days; a later expiry is caught by the periodic re-check.
    if (at) {
      this.expiry = setTimeout(() => this.end(CloseCode.unauthorized, "credential expired"), Math.min(at.getTime() - Date.now(), 2 ** 31 - 1));
      this.expiry.unref();
    }
  }

  /** Aborted when the connection ends: streams that wait on something else (a node's bus channel) stop on it. */
  get signal(): AbortSignal {
    return this.ending.signal;
  }

  /** Subscriptions open on this connection: each from its `operation()` until its `complete`, or the connection's end. */
  get subscriptions(): number {
    return this.operations.size;
  }

  /**
   * A subscription's own end, as a signal its source stops on. An async generator's `return()` waits behind its
   * pending `next()`, which for a quiet instance may never settle: a source completed by its client, left to
   * that, would stay attached to the feed until the connection ended. Call the returned `complete` when it ends.
   */
  operation(): { signal: AbortSignal; complete: () => void } {
    const op = new AbortController();
    if (this.ended) op.abort();
    else this.operations.add(op);
    return {
      signal: op.signal,
      complete: () => {
        this.operations.delete(op);
        op.abort();
      },
    };
  }

  /**
   * Read nothing more from the socket for `ms` (at most MAX_HOLD_MS): a client refused for its rate, that asks
   * again at once, would otherwise keep the server busy refusing it. Over HTTP each attempt costs the client a
   * request; over a websocket it costs one message, so the socket itself is made to wait.
   */
  hold(ms: number): void {
    if (this.ended || this.holding || !this.socket.pause) return;
    this.socket.pause();
    this.holding = setTimeout(
      () => {
        this.holding = undefined;
        if (!this.ended) this.socket.resume?.();
      },
      Math.min(Math.max(ms, 0), MAX_HOLD_MS),
    );
    this.holding.unref();
  }

  /** The client went away (or graphql-ws closed it): stop its streams, keep no record of it. */
  dropped(): void {
    this.finish();
  }

  /** Close the socket first (so nothing more is sent), then stop every stream of it at once. */
  end(code: number, reason: string): void {
    this.finish({ code, reason });
  }

  private finish(close?: { code: number; reason: string }): void {
    if (this.ended) return;
    this.ended = true;
    clearTimeout(this.expiry);
    clearTimeout(this.holding);
    this.hub.forget(this, close?.code);
    if (close) {
      try {
        this.socket.close(close.code, closeReason(close.reason));
      } catch {
        // already closed
      }
    }
    for (const s of this.streams) s.end();
    for (const op of this.operations) op.abort();
    this.operations.clear();
    this.ending.abort();
  }
}

/**
 * A subscription's live tail: a queue the feed pushes into and graphql-ws pulls from as fast as the socket
 * drains — or, where the subscription's events become frames as they are (`frames`, server/live/execute.ts),
 * each event written to the socket the moment the feed hands it over, in order. Either way an event counts as
 * its connection's backlog until the kernel has it, and too long a backlog ends the connection.
 */
class EventStream implements Sink, AsyncIterableIterator<WatchedEvent> {
  private queue: WatchedEvent[] = [];
  private wake: (() => void) | null = null;
  private done = false;
  /** Events at or below this were delivered already (or precede the cursor): never again. */
  floor = 0n;
  /** Set for the live tail of a subscription whose events are written straight to the socket. */
  frames: Frames | null = null;
  /** A frame whose payload is still being resolved: frames after it wait their turn behind it. */
  private pending: Promise<void> | null = null;

  constructor(
    readonly filter: EventFilter,
    private readonly conn: LiveConnection,
    private readonly limit: number,
  ) {}

  push(e: WatchedEvent): void {
    if (this.done || e.position <= this.floor) return;
    if (this.frames) {
      // Inside the feed's hand-over to every sink: a failure here is this connection's, not the other sinks'.
      let frame: string | Promise<string> | null;
      try {
        frame = this.frames(e);
      } catch {
        this.failed();
        return;
      }
      this.write(frame);
      return;
    }
    this.queue.push(e);
    if (this.behind()) return;
    this.wake?.();
  }

  /** One more event of the connection's backlog: past the limit, the connection ends (true). */
  private behind(): boolean {
    if (++this.conn.queued <= this.limit) return false;
    this.conn.end(CloseCode.slowConsumer, `slow consumer: over ${this.limit} events behind; reconnect and resume from your last cursor`);
    return true;
  }

  private failed(): void {
    this.conn.end(CloseCode.internalError, "an event could not be sent; reconnect and resume from your last cursor");
  }

  private write(frame: string | Promise<string> | null): void {
    if (frame === null) return;
    if (typeof frame === "string" && !this.pending) {
      this.send(frame);
      return;
    }
    const next = (this.pending ?? Promise.resolve())
      .then(async () => {
        const text = await frame;
        if (text !== null && !this.done) this.send(text);
      })
      .catch(() => this.failed());
    this.pending = next;
    void next.finally(() => {
      if (this.pending === next) this.pending = null;
    });
  }

  private send(frame: string): void {
    const { conn } = this;
    if (conn.ended || conn.socket.readyState !== OPEN || this.behind()) return;
    conn.socket.send(frame, () => conn.queued--);
  }

  end(): void {
    if (this.done) return;
    this.done = true;
    this.conn.queued -= this.queue.length;
    this.queue = [];
    this.wake?.();
  }

  get ended(): boolean {
    return this.done;
  }

  async next(): Promise<IteratorResult<WatchedEvent>> {
    for (;;) {
      const e = this.queue.shift();
      if (e) {
        this.conn.queued--;
        return { done: false, value: e };
      }
      if (this.done) return { done: true, value: undefined };
      await new Promise<void>((r) => {
        this.wake = r;
      });
      this.wake = null;
    }
  }

  async return(): Promise<IteratorResult<WatchedEvent>> {
    this.end();
    return { done: true, value: undefined };
  }

  [Symbol.asyncIterator]() {
    return this;
  }
}

/** Revocations remembered for connections still authenticating: far more than can land during one check. */
const RECENT_REVOCATIONS = 1024;

/**
 * The server's live side: its feed, its connections, and what ends them (revocation, expiry, shutdown,
 * falling behind). Embedded or on Redis it behaves the same; only the bus under the feed differs.
 */
export class LiveHub {
  readonly connections = new Set<LiveConnection>();
  /** Connections by caller, for the caps on what one caller may hold open. */
  private readonly byCaller = new Map<string, Set<LiveConnection>>();
  readonly closedBy = new Map<number, number>();
  private revocations: AsyncIterator<{ key: string }> | undefined;
  private listening: Promise<void> | undefined;
  private reauth: NodeJS.Timeout | undefined;
  /** Revocations heard so far, and the latest of them by count (revokedSince). */
  private revoked = 0;
  private readonly recentRevocations: { n: number; key: string }[] = [];
  /** Replays' turns (replayTurn): granted since the last pass, and those waiting for the next. */
  private turns = 0;
  private readonly waitingTurns: (() => void)[] = [];
  private passing = false;

  private constructor(
    private readonly platform: Platform,
    readonly feed: EventFeed,
    private readonly authenticate: (bearer: string) => Promise<Principal | null>,
  ) {}

  static async start(platform: Platform, authenticate: (bearer: string) => Promise<Principal | null>): Promise<LiveHub> {
    const hub = new LiveHub(platform, await EventFeed.start(platform), authenticate);
    const revocations = platform.bus.subscribe("credentialsRevoked");
    hub.revocations = revocations;
    hub.listening = (async () => {
      for await (const { key } of revocations) hub.revoke(key);
    })().catch((e) => platform.log.warn("live hub lost its revocation subscription", { err: String(e) }));
    hub.reauth = setInterval(() => void hub.recheck(), platform.config.live.reauthMs);
    hub.reauth.unref();
    return hub;
  }

  connect(socket: Socket, principal: Principal | null, bearer: string | null, info?: ConnectionInfo): LiveConnection {
    const conn = new LiveConnection(socket, principal, bearer, this, info);
    this.connections.add(conn);
    const caller = conn.info.caller;
    if (caller !== null) {
      const same = this.byCaller.get(caller);
      if (same) same.add(conn);
      else this.byCaller.set(caller, new Set([conn]));
    }
    return conn;
  }

  /** Called when a connection ends, however it ends. */
  forget(conn: LiveConnection, code?: number): void {
    if (!this.connections.delete(conn)) return;
    const caller = conn.info.caller;
    const same = caller === null ? undefined : this.byCaller.get(caller);
    if (same?.delete(conn) && same.size === 0) this.byCaller.delete(caller as string);
    if (code !== undefined) this.closedBy.set(code, (this.closedBy.get(code) ?? 0) + 1);
  }

  /** Connections `caller` holds open on this server. */
  connectionsOf(caller: string): number {
    return this.byCaller.get(caller)?.size ?? 0;
  }

  /** Subscriptions `caller` has open on this server, over all its connections (bounded by the cap on connections). */
  subscriptionsOf(caller: string): number {
    let n = 0;
    for (const c of this.byCaller.get(caller) ?? []) n += c.subscriptions;
    return n;
  }

  subscriptions(): number {
    let n = 0;
    for (const c of this.connections) n += c.streams.size;
    return n;
  }

  /**
   * A subscription: the events after `after` from the table (paged, at the subscriber's pace), then the live
   * tail. The switch happens when the replay reaches the feed's head, synchronously, so no event is missed or
   * repeated between the two. Without a cursor it starts at the head: changes from now on. With `frames`, the
   * live tail is written to the socket as it comes and this generator yields only the replay.
   */
  async *watch(conn: LiveConnection, filter: EventFilter, after: bigint | null, opts: WatchOptions = {}): AsyncGenerator<WatchedEvent> {
    const { frames, replay, signal } = opts;
    const stream = new EventStream(filter, conn, this.platform.config.live.bufferEvents);
    conn.streams.add(stream);
    const stop = () => stream.end();
    signal?.addEventListener("abort", stop, { once: true });
    if (signal?.aborted) stream.end();
    const read: Replay["read"] = replay ? (fn) => replay.read(fn) : (fn) => this.platform.read(fn);
    const size = replay?.page ?? PAGE;
    try {
      let last = after ?? this.feed.head;
      while (last < this.feed.head) {
        const target = this.feed.head;
        const from = last;
        const page = await read((sql) => readEvents(sql, filter, from, target, size));
        // Retention may have deleted events after the cursor before this page was read (a resume, not "0", which
        // asks for whatever is kept): the client comes back with its cursor and is told to start from now.
        if (after !== null && after > 0n && (await read(eventsHorizon)) > from) {
          conn.end(CloseCode.slowConsumer, "events after the cursor were pruned while it replayed");
          return;
        }
        if (page.length && replay) await replay.pay(page.length);
        for (const [i, e] of page.entries()) {
          if (stream.ended) return;
          // A page in memory is yielded, executed and written without any I/O to wait on: all in microtasks, which
          // never let the event loop read a socket. Every few events the replay waits for a turn (replayTurn).
          if (i % REPLAY_TURN === 0) await this.replayTurn();
          yield e;
          last = e.position;
        }
        if (page.length < size) last = target;
      }
      if (stream.ended) return;
      // A cursor can be ahead of this server's feed (it came from a replica that read further): the feed
      // then hands over events the client has seen, which the floor drops.
      stream.floor = last;
      // The replay went through graphql-ws, which wrote each event before asking for the next: from here the
      // live tail can be written straight to the socket behind it.
      if (frames) stream.frames = frames;
      this.feed.attach(stream);
      yield* stream;
    } finally {
      signal?.removeEventListener("abort", stop);
      this.feed.detach(stream);
      stream.end();
      conn.streams.delete(stream);
    }
  }

  /**
   * A replay's turn to send its next few events. setImmediate alone would not do: every replay that yielded runs
   * in the same check phase, one after another, before the loop reads a socket. Turns are handed out a few per
   * pass of the loop, over all replays together, so a request that arrives meanwhile waits for a few ms of them.
   */
  private replayTurn(): Promise<void> {
    if (this.turns < TURNS_PER_PASS && !this.waitingTurns.length) {
      this.turns++;
      this.nextPass();
      return Promise.resolve();
    }
    return new Promise((r) => {
      this.waitingTurns.push(r);
      this.nextPass();
    });
  }

  private nextPass(): void {
    if (this.passing) return;
    this.passing = true;
    setImmediate(() => {
      this.passing = false;
      const granted = this.waitingTurns.splice(0, TURNS_PER_PASS);
      this.turns = granted.length;
      for (const go of granted) go();
      if (this.waitingTurns.length || this.turns) this.nextPass();
    });
  }

  /** Whether no committed event has reached this cursor yet (the feed may lag: the table has the last word). */
  async isAhead(cursor: bigint, read: Replay["read"] = (fn) => this.platform.read(fn)): Promise<boolean> {
    return cursor > this.feed.head && cursor > (await read(headPosition));
  }

  revoke(key: string): void {
    this.recentRevocations.push({ n: ++this.revoked, key });
    if (this.recentRevocations.length > RECENT_REVOCATIONS) this.recentRevocations.splice(0, this.recentRevocations.length - RECENT_REVOCATIONS);
    for (const c of this.connections) if (c.principal?.credential?.key === key) c.end(CloseCode.unauthorized, "credential revoked");
  }

  /** Take before authenticating a connection; `revokedSince` then says whether a revocation overtook the check. */
  mark(): number {
    return this.revoked;
  }

  /**
   * Whether the principal's credential was revoked after `mark` ("revoked"): a connection checked before a
   * revocation and registered after it would not be among the connections the revocation ended. "unsure" when
   * more revocations came meanwhile than are remembered: the client should authenticate again, later.
   */
  revokedSince(mark: number, principal: Principal | null): "revoked" | "unsure" | null {
    const key = principal?.credential?.key;
    if (!key || this.revoked === mark) return null;
    if (this.recentRevocations.some((r) => r.n > mark && r.key === key)) return "revoked";
    return (this.recentRevocations[0]?.n ?? this.revoked + 1) > mark + 1 ? "unsure" : null;
  }

  /**
   * The safety net under revocation messages: every credential is checked again now and then — once per pass,
   * however many connections share it (ten thousand watchers on one token cost one read, not ten thousand).
   */
  private async recheck(): Promise<void> {
    const byBearer = new Map<string, LiveConnection[]>();
    for (const c of this.connections) {
      if (!c.bearer || !c.principal?.credential) continue;
      const same = byBearer.get(c.bearer);
      if (same) same.push(c);
      else byBearer.set(c.bearer, [c]);
    }
    for (const [bearer, conns] of byBearer) {
      try {
        if (await this.authenticate(bearer)) continue;
        for (const c of conns) c.end(CloseCode.unauthorized, "credential expired or revoked");
      } catch {
        // the database is unreachable: keep the connections, check again next time
      }
    }
  }

  /** Ask every client to come back later (to this server restarted, or another replica). */
  async close(): Promise<void> {
    clearInterval(this.reauth);
    for (const c of [...this.connections]) c.end(CloseCode.restart, "server restarting: reconnect and resume from your last cursor");
    await this.revocations?.return?.();
    await this.listening;
    await this.feed.close();
  }
}
