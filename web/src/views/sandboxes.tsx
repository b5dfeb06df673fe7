import { useEffect, useState } from "preact/hooks";
import {
  CreateSandboxDocument,
  createWsClient,
  DeleteSandboxDocument,
  InstanceEventsCursorDocument,
  SandboxDocument,
  SandboxEventsDocument,
  SandboxesDocument,
  type SandboxFieldsFragment,
  SandboxTemplatesDocument,
} from "../../../sdk/client.ts";
import { href, useQuery } from "../hooks.ts";
import { type Session, useSession } from "../session.ts";
import { Age, Badge, ConfirmButton, Empty, ErrorNote, Loading, Section } from "../ui.tsx";
import { ExecConsole } from "./exec.tsx";
import { WarmPools } from "./warm.tsx";

/**
 * Sandboxes, kept current by `sandboxEvents`: the newest event's cursor is read before the list and the stream
 * resumes from it, so a change made between the read and the stream's start is still delivered. Each event
 * re-reads its sandbox; a deleted one leaves the list.
 */
function useLiveSandboxes(s: Session) {
  const [rows, setRows] = useState<Map<string, SandboxFieldsFragment>>(new Map());
  const [loading, setLoading] = useState(true);
  const [error, setError] = useState<unknown>();
  useEffect(() => {
    let open = true;
    const held = new Map<string, SandboxFieldsFragment>();
    const show = () => open && setRows(new Map(held));
    const refresh = async (id: string) => {
      const { sandbox } = await s.client.request(SandboxDocument, { id });
      if (!sandbox || sandbox.state === "DELETED") held.delete(id);
      else held.set(id, sandbox);
      show();
    };
    const ws = createWsClient({ url: s.url, token: s.token });
    (async () => {
      const { instanceEventsCursor: after } = await s.client.request(InstanceEventsCursorDocument);
      const { sandboxes } = await s.client.request(SandboxesDocument, { first: 100 });
      for (const x of sandboxes) held.set(x.id, x);
      show();
      if (open) setLoading(false);
      for await (const { sandboxEvents: ev } of (await ws).subscribe(SandboxEventsDocument, { after })) await refresh(ev.sandboxId);
    })().catch((e) => {
      if (!open) return;
      setError(e);
      setLoading(false);
    });
    return () => {
      open = false;
      void ws.then((c) => c.dispose());
    };
  }, [s]);
  return { list: [...rows.values()].sort((a, b) => b.createdAt.localeCompare(a.createdAt)), loading, error };
}

export function SandboxesView() {
  const s = useSession();
  const { list, loading, error } = useLiveSandboxes(s);
  return (
    <>
      <Section title="Sandboxes" actions={s.viewer.tenantId && <NewSandbox />}>
        <ErrorNote error={error} />
        {loading ? (
          <Loading what="sandboxes" />
        ) : list.length === 0 ? (
          <Empty>No sandboxes. Start one from a template.</Empty>
        ) : (
          <table class="cards">
            <thead>
              <tr>
                <th>Sandbox</th>
                <th>State</th>
                <th>Template</th>
                <th>Instance</th>
                <th>Expires</th>
                <th>Age</th>
              </tr>
            </thead>
            <tbody>
              {list.map((x) => (
                <tr key={x.id} data-testid={`sandbox-${x.id}`}>
                  <td data-label="Sandbox">
                    <a href={href("sandboxes", x.id)}>{x.id}</a>
                    {x.warm && <span class="tag">warm start</span>}
                  </td>
                  <td data-label="State">
                    <Badge state={x.state} testId="state" />
                  </td>
                  <td data-label="Template">{x.templateId ?? (x.fromSnapshotId ? `snapshot ${x.fromSnapshotId}` : "—")}</td>
                  <td data-label="Instance">
                    <a href={href("instances", x.instance.id)}>{x.instance.id}</a> <Badge state={x.instance.state} />
                  </td>
                  <td data-label="Expires">
                    <time dateTime={x.expiresAt}>{new Date(x.expiresAt).toLocaleTimeString()}</time>
                  </td>
                  <td data-label="Age">
                    <Age from={x.createdAt} suffix="" />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </Section>
      <WarmPools />
    </>
  );
}

function NewSandbox() {
  const s = useSession();
  const templates = useQuery(() => s.client.request(SandboxTemplatesDocument).then((r) => r.sandboxTemplates), [s]);
  const [templateId, setTemplateId] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>();
  const chosen = templateId || templates.data?.[0]?.id || "";
  if (templates.data?.length === 0) return <span class="muted">No templates yet</span>;
  const start = async () => {
    setBusy(true);
    setError(undefined);
    try {
      const { createSandbox } = await s.client.request(CreateSandboxDocument, { input: { templateId: chosen, idempotencyKey: crypto.randomUUID() } });
      location.hash = href("sandboxes", createSandbox.id);
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  return (
    <>
      <select aria-label="template" value={chosen} onChange={(e) => setTemplateId(e.currentTarget.value)}>
        {templates.data?.map((t) => (
          <option key={t.id} value={t.id}>
            {t.name}
          </option>
        ))}
      </select>
      <button type="button" class="primary" disabled={busy || !chosen} onClick={start}>
        New sandbox
      </button>
      <ErrorNote error={error ?? templates.error} onClose={() => setError(undefined)} />
    </>
  );
}

export function SandboxView({ id }: { id: string }) {
  const s = useSession();
  // The cursor is read before the sandbox, and the stream resumes from it: a claim's resume can reach running
  // between the read and the stream's start, and that event must still arrive.
  const read = useQuery(async () => {
    const { instanceEventsCursor: after } = await s.client.request(InstanceEventsCursorDocument);
    return { after, sandbox: (await s.client.request(SandboxDocument, { id })).sandbox };
  }, [s, id]);
  const [sandbox, setSandbox] = useState<SandboxFieldsFragment | null>(null);
  useEffect(() => setSandbox(read.data?.sandbox ?? null), [read.data]);
  const after = read.data?.after;
  useEffect(() => {
    if (after === undefined) return;
    let open = true;
    const ws = createWsClient({ url: s.url, token: s.token });
    (async () => {
      for await (const { sandboxEvents: ev } of (await ws).subscribe(SandboxEventsDocument, { sandboxId: id, after })) {
        const { sandbox: now } = await s.client.request(SandboxDocument, { id: ev.sandboxId });
        if (open && now) setSandbox(now);
      }
    })().catch(() => {});
    return () => {
      open = false;
      void ws.then((c) => c.dispose());
    };
  }, [s, id, after]);
  if (read.error) return <ErrorNote error={read.error} />;
  if (!sandbox) return read.loading ? <Loading what="the sandbox" /> : <Empty>No sandbox {id}.</Empty>;
  const x = sandbox;
  return (
    <>
      <p>
        <a href={href("sandboxes")}>← Sandboxes</a>
      </p>
      <Section
        title={x.id}
        actions={
          <ConfirmButton
            label="Delete"
            danger
            question={`Delete sandbox ${x.id}? Its VM and disk go with it.`}
            disabled={x.state === "DELETING" || x.state === "DELETED"}
            action={() => s.client.request(DeleteSandboxDocument, { id: x.id })}
          />
        }
      >
        <dl class="facts">
          <dt>State</dt>
          <dd>
            <Badge state={x.state} testId="sandbox-state" /> <span class="muted">instance</span> <Badge state={x.instance.state} />
          </dd>
          <dt>Instance</dt>
          <dd>
            <a href={href("instances", x.instance.id)}>{x.instance.id}</a>
          </dd>
          <dt>Addresses</dt>
          <dd>{x.instance.addresses.join(", ") || "none yet"}</dd>
          <dt>Expires</dt>
          <dd>{new Date(x.expiresAt).toLocaleString()}</dd>
          <dt>Started</dt>
          <dd>{x.warm ? "from a warm pool" : "cold"}</dd>
        </dl>
      </Section>
      <ExecConsole sandboxId={x.id} ready={x.state === "RUNNING"} />
    </>
  );
}
