import type { Principal } from "../../core/auth/principal.ts";
import { eventsHorizon } from "../../core/books/retention.ts";
import { type EventFilter, headPosition, readEvents, type WatchedEvent } from "../../core/instances/events.ts";
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
  /** The server could not check the credential (its database is unreachable): retry later. */
  tryAgainLater: 1013,
} as const;

/** What the hub needs of a websocket (the `ws` library's). */
export interface Socket {
  close(code: number, reason: string): void;
  /** `done` is called once the frame is handed to the kernel (or failed to be). */
  send(frame: string, done: (err?: Error) => void): void;
  readonly readyState: number;
}

/** WebSocket readyState OPEN. */
const OPEN = 1;

/** Catch-up pages while a subscriber replays from its cursor: paced by the subscriber, so never counted as backlog. */
const PAGE = 500;

/** One websocket: who it speaks for, and the backlog of all its subscriptions together. */
export class LiveConnection {
  queued = 0;
  readonly streams = new Set<EventStream>();
  private expiry: NodeJS.Timeout | undefined;
  private readonly ending = new AbortController();
  ended = false;

  constructor(
    readonly socket: Socket,
    readonly principal: Principal | null,
    /** The bearer, kept to re-check it (a revocation message can be lost). */
    readonly bearer: string | null,
    private readonly hub: LiveHub,
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
    this.hub.forget(this, close?.code);
    if (close) {
      try {
        this.socket.close(close.code, close.reason);
      } catch {
        // already closed
      }
    }
    for (const s of this.streams) s.end();
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
  readonly closedBy = new Map<number, number>();
  private revocations: AsyncIterator<{ key: string }> | undefined;
  private listening: Promise<void> | undefined;
  private reauth: NodeJS.Timeout | undefined;
  /** Revocations heard so far, and the latest of them by count (revokedSince). */
  private revoked = 0;
  private readonly recentRevocations: { n: number; key: string }[] = [];

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

  connect(socket: Socket, principal: Principal | null, bearer: string | null): LiveConnection {
    const conn = new LiveConnection(socket, principal, bearer, this);
    this.connections.add(conn);
    return conn;
  }

  /** Called when a connection ends, however it ends. */
  forget(conn: LiveConnection, code?: number): void {
    if (!this.connections.delete(conn)) return;
    if (code !== undefined) this.closedBy.set(code, (this.closedBy.get(code) ?? 0) + 1);
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
  async *watch(conn: LiveConnection, filter: EventFilter, after: bigint | null, frames?: Frames): AsyncGenerator<WatchedEvent> {
    const stream = new EventStream(filter, conn, this.platform.config.live.bufferEvents);
    conn.streams.add(stream);
    try {
      let last = after ?? this.feed.head;
      while (last < this.feed.head) {
        const target = this.feed.head;
        const from = last;
        const page = await this.platform.read((sql) => readEvents(sql, filter, from, target, PAGE));
        // Retention may have deleted events after the cursor before this page was read (a resume, not "0", which
        // asks for whatever is kept): the client comes back with its cursor and is told to start from now.
        if (after !== null && after > 0n && (await this.platform.read(eventsHorizon)) > from) {
          conn.end(CloseCode.slowConsumer, "events after the cursor were pruned while it replayed");
          return;
        }
        for (const e of page) {
          if (stream.ended) return;
          yield e;
          last = e.position;
        }
        if (page.length < PAGE) last = target;
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
      this.feed.detach(stream);
      stream.end();
      conn.streams.delete(stream);
    }
  }

  /** Whether no committed event has reached this cursor yet (the feed may lag: the table has the last word). */
  async isAhead(cursor: bigint): Promise<boolean> {
    return cursor > this.feed.head && cursor > (await this.platform.read(headPosition));
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
