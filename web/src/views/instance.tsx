import { useEffect, useState } from "preact/hooks";
import {
  DeleteInstanceDocument,
  FlavorsDocument,
  InstanceDocument,
  type InstanceEventFieldsFragment,
  type InstanceFieldsFragment,
  ResizeInstanceDocument,
  StartInstanceDocument,
  StopInstanceDocument,
  watchInstance,
} from "../../../sdk/client.ts";
import { href, useQuery } from "../hooks.ts";
import { merge } from "../live.ts";
import { type Session, useSession } from "../session.ts";
import { Age, Badge, ConfirmButton, Empty, ErrorNote, Loading, mib, Section } from "../ui.tsx";

type Event = InstanceEventFieldsFragment;

/**
 * One instance's history and live state: its events from the first (cursor 0) and then as they happen, over one
 * resumable subscription; the instance's fields follow the newest event.
 */
function useTimeline(s: Session, id: string) {
  const [events, setEvents] = useState<Event[]>([]);
  const [error, setError] = useState<unknown>();
  useEffect(() => {
    const stop = new AbortController();
    const seen: Event[] = [];
    setEvents([]);
    (async () => {
      for await (const ev of watchInstance({ url: s.url, token: s.token, id, after: "0", signal: stop.signal })) {
        seen.push(ev);
        setEvents([...seen]);
      }
    })().catch((e) => !stop.signal.aborted && setError(e));
    return () => stop.abort();
  }, [s, id]);
  return { events, error };
}

export function InstanceView({ id }: { id: string }) {
  const s = useSession();
  const read = useQuery(() => s.client.request(InstanceDocument, { id }).then((r) => r.instance), [s, id]);
  const { events, error } = useTimeline(s, id);
  const [latest, setLatest] = useState<InstanceFieldsFragment | null>(null);
  const last = events.at(-1);
  useEffect(() => {
    if (read.data) setLatest(read.data);
  }, [read.data]);
  useEffect(() => {
    if (last) setLatest((held) => (held ? (merge(held, last.instance) ?? held) : held));
  }, [last]);

  if (read.error) return <ErrorNote error={read.error} />;
  if (!latest) return read.loading ? <Loading what="the instance" /> : <Empty>No instance {id}.</Empty>;
  const i = latest;
  return (
    <>
      <p>
        <a href={href("instances")}>← Instances</a>
      </p>
      <Section title={i.id} actions={<Actions i={i} onChange={(n) => setLatest((held) => (held ? (merge(held, n) ?? held) : held))} />}>
        <dl class="facts">
          <dt>State</dt>
          <dd>
            <Badge state={i.state} testId="state" /> <span class="muted">wants {i.desiredState.toLowerCase()}</span>
          </dd>
          <dt>Flavor</dt>
          <dd>{`${i.flavor}: ${i.vcpus} vCPU, ${mib(i.memoryMib)}, ${i.diskGib} GiB disk`}</dd>
          {i.gpus.length > 0 && (
            <>
              <dt>GPUs</dt>
              <dd>{i.gpus.map((g) => `${g.count}× ${g.model}`).join(", ")}</dd>
            </>
          )}
          <dt>Addresses</dt>
          <dd>{i.addresses.join(", ") || "none yet"}</dd>
          <dt>Image</dt>
          <dd>{i.imageId}</dd>
          <dt>Pool</dt>
          <dd>{i.poolId}</dd>
          {i.nodeId && (
            <>
              <dt>Host</dt>
              <dd>{i.nodeId}</dd>
            </>
          )}
          {i.sandboxId && (
            <>
              <dt>Sandbox</dt>
              <dd>
                <a href={href("sandboxes", i.sandboxId)}>{i.sandboxId}</a>
              </dd>
            </>
          )}
          <dt>Created</dt>
          <dd>
            <Age from={i.createdAt} />
          </dd>
          <dt>Conditions</dt>
          <dd>
            {i.conditions.length
              ? i.conditions.map((c) => (
                  <div key={c.type}>
                    <strong>{c.type}</strong> {c.reason} <span class="muted">{c.message}</span>
                  </div>
                ))
              : "none"}
          </dd>
        </dl>
      </Section>
      <Section title="Timeline">
        <ErrorNote error={error} />
        {events.length === 0 ? <Loading what="events" /> : <Timeline events={events} />}
      </Section>
    </>
  );
}

function Timeline({ events }: { events: Event[] }) {
  return (
    <ol class="timeline" data-testid="timeline">
      {events.toReversed().map((e) => (
        <li key={e.cursor} data-to={e.toState}>
          <Badge state={e.toState} />
          <span class="muted">{e.fromState ? ` from ${e.fromState.toLowerCase()}` : " created"}</span>
          <span class="reason">{e.reason}</span>
          <span class="muted">by {e.actor}</span>
          <time dateTime={e.at}>{new Date(e.at).toLocaleString()}</time>
        </li>
      ))}
    </ol>
  );
}

function Actions({ i, onChange }: { i: InstanceFieldsFragment; onChange: (i: InstanceFieldsFragment) => void }) {
  const s = useSession();
  const flavors = useQuery(() => s.client.request(FlavorsDocument, { poolId: i.poolId }).then((r) => r.flavors), [s, i.poolId]);
  const [flavor, setFlavor] = useState("");
  const gone = i.desiredState === "DELETED";
  // A sandbox's instance is the sandbox's to drive: the API refuses these, so the page does not offer them.
  const owned = Boolean(i.sandboxId) || gone;
  return (
    <>
      {owned && !gone && <span class="muted">driven by its sandbox</span>}
      <ConfirmButton
        label="Start"
        question={`Start ${i.id}?`}
        disabled={owned || i.desiredState === "RUNNING"}
        action={async () => onChange((await s.client.request(StartInstanceDocument, { id: i.id })).startInstance)}
      />
      <ConfirmButton
        label="Stop"
        question={`Stop ${i.id}? Its guest is shut down; its disk and address stay.`}
        disabled={owned || i.desiredState === "STOPPED"}
        action={async () => onChange((await s.client.request(StopInstanceDocument, { id: i.id })).stopInstance)}
      />
      <select aria-label="new flavor" value={flavor} disabled={owned} onChange={(e) => setFlavor(e.currentTarget.value)}>
        <option value="">resize to…</option>
        {flavors.data
          ?.filter((f) => f.name !== i.flavor)
          .map((f) => (
            <option key={f.id} value={f.name}>
              {`${f.name} (${f.vcpus} vCPU, ${mib(f.memoryMib)})`}
            </option>
          ))}
      </select>
      <ConfirmButton
        label="Resize"
        question={`Resize ${i.id} from ${i.flavor} to ${flavor}?`}
        disabled={owned || !flavor}
        action={async () => {
          onChange((await s.client.request(ResizeInstanceDocument, { id: i.id, flavor })).resizeInstance);
          setFlavor("");
        }}
      />
      <ConfirmButton
        label="Delete"
        danger
        question={`Delete ${i.id}? Its disk is destroyed and its address released. This cannot be undone.`}
        disabled={owned}
        action={async () => onChange((await s.client.request(DeleteInstanceDocument, { id: i.id })).deleteInstance)}
      />
    </>
  );
}
