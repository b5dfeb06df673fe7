import { type EventFilter, headPosition, matches, readEvents, type WatchedEvent } from "../../core/instances/events.ts";
import type { Platform } from "../../infra/platform.ts";

/** A local subscriber of the feed: it gets every event after the head at which it attached that its filter matches. */
export interface Sink {
  filter: EventFilter;
  push(e: WatchedEvent): void;
}

const BATCH = 500;

/**
 * Where a sink is filed: under the narrowest thing its filter names. An event then visits only the sinks filed
 * under its instance, project, pool or tenant, and those that watch everything: ten thousand watchers of one
 * instance each cost an event one lookup, not ten thousand filter checks.
 */
function keyOf(f: EventFilter): string {
  if (f.instanceId !== undefined) return `i:${f.instanceId}`;
  if (f.projectId !== undefined) return `j:${f.projectId}`;
  if (f.poolId !== undefined) return `p:${f.poolId}`;
  if (f.tenantId !== undefined) return `t:${f.tenantId}`;
  return "*";
}

/**
 * One per server process: tails the event table in commit order and hands each event to the local sinks whose
 * filter matches. A pub/sub message only wakes it (so a thousand subscribers cost one read per burst, not a
 * thousand); a poll covers messages lost while Redis reconnects. Because positions are given in commit order,
 * reading `position > head` never skips an event that commits later.
 */
export class EventFeed {
  /** Every event up to here has been handed to the sinks attached at the time. */
  head = 0n;
  readonly sinks = new Set<Sink>();
  /** The same sinks, filed by keyOf(filter). */
  private readonly filed = new Map<string, Set<Sink>>();
  delivered = 0;
  /** Events read from the table to be delivered (metrics): the events of this process's own writes need no read. */
  readBack = 0;
  private draining: Promise<void> | null = null;
  private again = false;
  private closed = false;
  private timer: NodeJS.Timeout | undefined;
  private hints: AsyncIterator<unknown> | undefined;
  private listening: Promise<void> | undefined;

  private constructor(private readonly platform: Platform) {}

  private readonly onLocal = (events: WatchedEvent[]) => this.local(events);

  static async start(platform: Platform): Promise<EventFeed> {
    const feed = new EventFeed(platform);
    // Listen before reading the head: an event committed in between is then both below the head or woken for.
    const hints = platform.bus.subscribe("instanceEvents");
    feed.hints = hints;
    feed.listening = (async () => {
      // The write's last event is its highest position; a message of another shape just makes the feed read.
      for await (const m of hints) feed.hint((m as { events?: { cursor?: unknown }[] }).events?.at(-1)?.cursor);
    })().catch((e) => platform.log.warn("event feed lost its pub/sub subscription", { err: String(e) }));
    feed.head = await platform.read(headPosition);
    platform.localEvents.add(feed.onLocal);
    feed.timer = setInterval(() => feed.poke(), platform.config.live.pollMs);
    feed.timer.unref();
    return feed;
  }

  /**
   * A committed event's bus message. With nobody listening and no read under way, the head just moves to its
   * position (positions follow commit order, so everything below it has committed): no read per event for a
   * server without subscribers. Otherwise, read.
   */
  hint(cursor: unknown): void {
    const at = typeof cursor === "string" && /^\d{1,19}$/.test(cursor) ? BigInt(cursor) : null;
    // Handed over already (by this process's own write, below, or a read that went past it).
    if (at !== null && at <= this.head) return;
    if (this.sinks.size === 0 && !this.draining && at !== null) {
      this.head = at;
      return;
    }
    this.poke();
  }

  /**
   * The events of a write this process committed, positioned and whole (infra/platform.ts): when they are the
   * very next ones after the head, with no read under way, they are handed over as they are — no read of what
   * this process was just told. Otherwise (another process's events come between, a read is under way) their
   * bus messages, which follow, make the feed read as usual.
   */
  local(events: readonly WatchedEvent[]): void {
    if (this.closed || this.draining) return;
    let next = this.head + 1n;
    for (const e of events) if (e.position !== next++) return;
    for (const e of events) {
      this.head = e.position;
      this.deliver(e);
    }
  }

  /** Read what committed since the head, now or right after the read in progress. */
  poke(): void {
    if (this.closed) return;
    if (this.draining) {
      this.again = true;
      return;
    }
    this.draining = this.drain().finally(() => {
      this.draining = null;
    });
  }

  /** Synchronous on purpose: a sink attached now gets exactly the events after the current head. */
  attach(sink: Sink): void {
    if (this.sinks.has(sink)) return;
    this.sinks.add(sink);
    const key = keyOf(sink.filter);
    let filed = this.filed.get(key);
    if (!filed) {
      filed = new Set();
      this.filed.set(key, filed);
    }
    filed.add(sink);
  }

  detach(sink: Sink): void {
    if (!this.sinks.delete(sink)) return;
    const key = keyOf(sink.filter);
    const filed = this.filed.get(key);
    filed?.delete(sink);
    if (filed?.size === 0) this.filed.delete(key);
  }

  /** Hand one event to every sink whose filter matches it. */
  private deliver(e: WatchedEvent): void {
    for (const key of [`i:${e.instanceId}`, e.projectId === null ? null : `j:${e.projectId}`, `p:${e.poolId}`, `t:${e.tenantId}`, "*"]) {
      const filed = key === null ? undefined : this.filed.get(key);
      if (!filed) continue;
      for (const sink of filed) {
        if (!matches(sink.filter, e)) continue;
        sink.push(e);
        this.delivered++;
      }
    }
  }

  private async drain(): Promise<void> {
    try {
      do {
        this.again = false;
        for (;;) {
          const from = this.head;
          if (this.sinks.size === 0) {
            // Nobody listens: only move the head, unless a sink attached during the read (it needs the events).
            const head = await this.platform.read(headPosition);
            if (this.sinks.size === 0 && this.head === from) {
              if (head > from) this.head = head;
              break;
            }
            continue;
          }
          const batch = await this.platform.read((sql) => readEvents(sql, {}, from, null, BATCH));
          this.readBack += batch.length;
          for (const e of batch) {
            this.head = e.position;
            this.deliver(e);
          }
          if (batch.length < BATCH) break;
        }
      } while (this.again && !this.closed);
    } catch (e) {
      // The next hint or poll tries again from the same head: nothing is skipped.
      this.platform.log.warn("event feed read failed", { err: String(e) });
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    this.platform.localEvents.delete(this.onLocal);
    clearInterval(this.timer);
    await this.hints?.return?.();
    await this.listening;
    await this.draining;
    this.sinks.clear();
    this.filed.clear();
  }
}
