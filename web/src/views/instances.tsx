import { useState } from "preact/hooks";
import { CreateInstanceDocument, FlavorsDocument, ImagesDocument, PoolsDocument } from "../../../sdk/client.ts";
import { href, useQuery } from "../hooks.ts";
import { type InstanceRow, useLiveInstances } from "../live.ts";
import { useSession } from "../session.ts";
import { Age, Badge, Empty, ErrorNote, Loading, mib, Section } from "../ui.tsx";

export function InstancesView() {
  const s = useSession();
  const { list, loading, live, error, more } = useLiveInstances(s);
  const [creating, setCreating] = useState(false);
  return (
    <Section
      title="Instances"
      actions={
        <>
          <span class={`live ${live ? "on" : ""}`} data-testid="live">
            {live ? "live" : "offline"}
          </span>
          {s.viewer.tenantId && (
            <button type="button" class="primary" onClick={() => setCreating(!creating)}>
              {creating ? "Close" : "New instance"}
            </button>
          )}
        </>
      }
    >
      {creating && <CreateInstance onDone={() => setCreating(false)} />}
      <ErrorNote error={error} />
      {loading ? (
        <Loading what="instances" />
      ) : list.length === 0 ? (
        <Empty>No instances yet.{s.viewer.tenantId ? " Create one with New instance." : ""}</Empty>
      ) : (
        <InstanceTable rows={list} operator={s.viewer.isOperator} />
      )}
      {more && <p class="muted">Showing the newest 200 instances.</p>}
    </Section>
  );
}

function InstanceTable({ rows, operator }: { rows: InstanceRow[]; operator: boolean }) {
  return (
    <table class="cards">
      <thead>
        <tr>
          <th>Instance</th>
          <th>State</th>
          <th>Flavor</th>
          <th>Addresses</th>
          {operator && <th>Tenant</th>}
          <th>Conditions</th>
          <th>Age</th>
        </tr>
      </thead>
      <tbody>
        {rows.map((i) => (
          <tr key={i.id} data-testid={`instance-${i.id}`}>
            <td data-label="Instance">
              <a href={href("instances", i.id)}>{i.id}</a>
              {i.sandboxId && <span class="tag">sandbox</span>}
            </td>
            <td data-label="State">
              <Badge state={i.state} testId="state" />
              {i.desiredState !== i.state && i.state !== "ERROR" && <span class="muted"> → {i.desiredState.toLowerCase()}</span>}
            </td>
            <td data-label="Flavor">
              {i.flavor} <span class="muted">{`${i.vcpus} vCPU · ${mib(i.memoryMib)} · ${i.diskGib} GiB`}</span>
            </td>
            <td data-label="Addresses">{i.addresses.join(", ") || "—"}</td>
            {operator && <td data-label="Tenant">{i.tenantId}</td>}
            <td data-label="Conditions">
              {i.conditions.length ? i.conditions.map((c) => <span key={c.type} class="tag" title={c.message}>{`${c.type}: ${c.reason}`}</span>) : "—"}
            </td>
            <td data-label="Age">
              <Age from={i.createdAt} suffix="" />
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** Pool, then the pool's flavors and the images the tenant can use; one key per form so a double submit creates once. */
function CreateInstance({ onDone }: { onDone: () => void }) {
  const s = useSession();
  const pools = useQuery(() => s.client.request(PoolsDocument).then((r) => r.pools), [s]);
  const images = useQuery(() => s.client.request(ImagesDocument).then((r) => r.images), [s]);
  const [poolId, setPoolId] = useState("");
  const pool = poolId || pools.data?.[0]?.id || "";
  const flavors = useQuery(() => (pool ? s.client.request(FlavorsDocument, { poolId: pool }).then((r) => r.flavors) : Promise.resolve([])), [s, pool]);
  const [key] = useState(() => crypto.randomUUID());
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>();
  const submit = async (e: Event) => {
    e.preventDefault();
    const form = new FormData(e.currentTarget as HTMLFormElement);
    setBusy(true);
    setError(undefined);
    try {
      await s.client.request(CreateInstanceDocument, {
        input: { poolId: pool, flavor: String(form.get("flavor")), imageId: String(form.get("image")), idempotencyKey: key },
      });
      onDone();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="panel" onSubmit={submit} aria-label="new instance">
      <label>
        Pool
        <select name="pool" value={pool} onChange={(e) => setPoolId(e.currentTarget.value)}>
          {pools.data?.map((p) => (
            <option key={p.id} value={p.id}>
              {p.name}
            </option>
          ))}
        </select>
      </label>
      <label>
        Flavor
        <select name="flavor" required>
          {flavors.data?.map((f) => (
            <option key={f.id} value={f.name}>
              {`${f.name} — ${f.vcpus} vCPU, ${mib(f.memoryMib)}, ${f.diskGib} GiB${f.gpus.length ? `, ${f.gpus.map((g) => `${g.count}× ${g.model}`).join(", ")}` : ""}`}
            </option>
          ))}
        </select>
      </label>
      <label>
        Image
        <select name="image" required>
          {images.data?.map((i) => (
            <option key={i.id} value={i.id}>
              {i.name}
            </option>
          ))}
        </select>
      </label>
      <div class="row end">
        <button type="submit" class="primary" disabled={busy || !pool}>
          Create
        </button>
      </div>
      <ErrorNote error={error ?? pools.error ?? flavors.error ?? images.error} />
    </form>
  );
}
