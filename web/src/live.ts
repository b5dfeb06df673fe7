import { useEffect, useState } from "preact/hooks";
import {
  InstanceDocument,
  type InstanceEventFieldsFragment,
  InstanceEventsCursorDocument,
  type InstanceFieldsFragment,
  InstancesDocument,
  watchInstanceEvents,
} from "../../sdk/client.ts";
import type { Session } from "./session.ts";

export type InstanceRow = InstanceFieldsFragment;
type Seen = InstanceEventFieldsFragment["instance"];

/** The newer of what we hold and what arrived: events and reads race, and the instance's version orders them. */
export function merge(held: InstanceRow | undefined, seen: Seen | InstanceRow): InstanceRow | undefined {
  if (!held) return "vcpus" in seen ? seen : undefined;
  return seen.version >= held.version ? { ...held, ...seen } : held;
}

/**
 * The caller's instances, kept current by the event stream: read the cursor, then the list, then follow every
 * change after that cursor (resumed across drops by the SDK), so nothing between the read and the stream is
 * lost. An instance first seen in an event is read whole once; a deleted one leaves the list.
 */
export function useLiveInstances(s: Session) {
  const [rows, setRows] = useState<Map<string, InstanceRow>>(new Map());
  const [loading, setLoading] = useState(true);
  const [live, setLive] = useState(false);
  const [error, setError] = useState<unknown>();
  const [more, setMore] = useState(false);
  useEffect(() => {
    const stop = new AbortController();
    // The effect's own copy, so a change can be judged against what is held without waiting for a render.
    const held = new Map<string, InstanceRow>();
    const apply = (seen: Seen | InstanceRow) => {
      const merged = merge(held.get(seen.id), seen);
      if (seen.state === "DELETED") held.delete(seen.id);
      else if (merged) held.set(seen.id, merged);
      setRows(new Map(held));
    };
    (async () => {
      const { instanceEventsCursor: after } = await s.client.request(InstanceEventsCursorDocument);
      const page = await s.client.request(InstancesDocument, { first: 200 });
      for (const e of page.instances.edges) apply(e.node);
      setMore(page.instances.pageInfo.hasNextPage);
      setLoading(false);
      setLive(true);
      const events = watchInstanceEvents({ url: s.url, token: s.token, after, signal: stop.signal, onReconnect: () => setLive(false) });
      for await (const ev of events) {
        setLive(true);
        apply(ev.instance);
        if (ev.instance.state !== "DELETED" && !held.has(ev.instance.id)) {
          const { instance } = await s.client.request(InstanceDocument, { id: ev.instance.id });
          if (instance) apply(instance);
        }
      }
    })().catch((e) => {
      if (stop.signal.aborted) return;
      setError(e);
      setLive(false);
      setLoading(false);
    });
    return () => stop.abort();
  }, [s]);
  const list = [...rows.values()].sort((a, b) => b.createdAt.localeCompare(a.createdAt));
  return { list, loading, live, error, more };
}
