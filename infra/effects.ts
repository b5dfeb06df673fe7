import type { WatchedEvent } from "../core/instances/events.ts";
import type { Instance } from "../core/instances/model.ts";
import type { EventDetail, Write } from "../core/kernel/write.ts";
import type { Bus } from "./bus.ts";
import type { Jobs } from "./jobs.ts";
import type { Logger } from "./log.ts";
import type { WriteCounts } from "./metrics.ts";

/** A live feed of this process (server/live/feed.ts), handed the events of every write committed here. */
export type LocalFeed = (events: WatchedEvent[]) => void;

/** What a committed write sets off, in the order the write runner (./write-runner.ts) calls them. */
export interface WriteEffects {
  /**
   * What hosts and live connections must hear of a write at once, sent before its events are positioned: none
   * of it needs a position, and a warm claim's resume or a new instance's spec would otherwise wait for the
   * sequencer's round trip.
   */
  tellHosts(w: Write): void;
  /** Once its events are positioned: the local feeds, the bus, and the jobs it woke. */
  apply(w: Write): Promise<void>;
}

export interface EffectDeps {
  bus: Bus;
  jobs: Jobs;
  log: Logger;
  counts: WriteCounts;
  localEvents: ReadonlySet<LocalFeed>;
}

/** The after-commit effects of this process's writes: a failure in one is logged, and the write stays committed. */
export function writeEffects({ bus, jobs, log, counts, localEvents }: EffectDeps): WriteEffects {
  function tellHosts(w: Write): void {
    try {
      // Commands first: a resume's agent then holds its instance before the spec that says the same arrives.
      for (const [nodeId, commands] of w.commandsFor) bus.publish("hostCommands", { nodeId, commands }, nodeId);
      for (const [nodeId, generation] of w.specs) bus.publish("nodeSpecs", { nodeId, generation }, nodeId);
      for (const key of w.revoked) bus.publish("credentialsRevoked", { key });
    } catch (err) {
      log.warn("after-commit effects failed", { actor: w.actor, err: String(err) });
    }
  }

  /** The write's events, whole, to this process's feeds. */
  function handToFeeds(w: Write): void {
    if (!localEvents.size || !w.events.length) return;
    const watched = watchedEvents(w);
    if (!watched) return;
    // A feed that fails here reads the events when their messages come: the messages must still go out.
    for (const feed of localEvents)
      try {
        feed(watched);
      } catch (err) {
        log.warn("handing events to the live feed failed", { actor: w.actor, err: String(err) });
      }
  }

  function publish(w: Write): void {
    if (w.events.length) bus.publish("instanceEvents", { events: w.events });
    counts.eventsPublished += w.events.length;
    for (const commandId of w.execOutputs) bus.publish("execOutput", { commandId }, commandId);
  }

  /** The write's wake-ups and deadlines, each enqueued into `enqueued` without waiting for the one before. */
  function enqueueJobs(w: Write, enqueued: Promise<void>[]): void {
    for (const instanceId of w.wakes) if (!w.settled.has(instanceId)) enqueued.push(jobs.enqueue("vps.instances", { instanceId }));
    for (const accountId of w.providerAccounts) enqueued.push(jobs.enqueue("vps.providers", { accountId }));
    for (const tenantId of w.tenantsToTearDown) enqueued.push(jobs.enqueue("vps.tenants", { tenantId }));
    if (w.sandboxes) enqueued.push(jobs.enqueue("vps.sandboxes", {}, { delayMs: w.sandboxes.delayMs }));
    // Deadlines are on the platform's clock; the delay is measured from the write's own time.
    for (const [sandboxId, at] of w.deadlines)
      enqueued.push(jobs.enqueue("vps.sandbox.expire", { sandboxId }, { delayMs: Math.max(0, at.getTime() - w.now.getTime()) }));
  }

  /**
   * Publishing and waking are hints: a failure here delays convergence (the sweep re-finds it), never loses state.
   * The jobs go to the queue at once, not one after another: each is a few round trips to Redis, and a warm
   * claim's answer (and the host's report coming in meanwhile) would wait for all of them in turn.
   */
  async function apply(w: Write): Promise<void> {
    const enqueued: Promise<void>[] = [];
    try {
      handToFeeds(w);
      publish(w);
      enqueueJobs(w, enqueued);
    } catch (err) {
      log.warn("after-commit effects failed", { actor: w.actor, err: String(err) });
    }
    for (const r of await Promise.allSettled(enqueued))
      if (r.status === "rejected") log.warn("after-commit effects failed", { actor: w.actor, err: String(r.reason) });
  }

  return { tellHosts, apply };
}

/**
 * A committed write's events as a live feed delivers them, each with its instance as the write left it (the
 * last row it wrote for that instance, as a read right after the commit would find it); null when an event
 * lacks what its row holds (its writer did not say), and the feed reads them from the table as usual.
 */
function watchedEvents(w: Write): WatchedEvent[] | null {
  const latest = new Map<string, object>();
  for (const e of w.events) {
    const detail = w.eventDetails.get(e);
    if (!detail || !/^\d{1,19}$/.test(e.cursor)) return null;
    latest.set(e.instanceId, detail.instance);
  }
  return w.events.map((e) => {
    const d = w.eventDetails.get(e) as EventDetail;
    return {
      position: BigInt(e.cursor),
      instanceId: e.instanceId,
      tenantId: e.tenantId,
      poolId: e.poolId,
      projectId: e.projectId,
      fromState: e.fromState,
      toState: e.toState,
      desiredState: d.desiredState,
      reason: d.reason,
      actor: d.actor,
      version: e.version,
      at: d.at,
      instance: latest.get(e.instanceId) as Instance,
    };
  });
}
