import type { ComponentChildren } from "preact";
import { useRef, useState } from "preact/hooks";
import { useNow } from "./hooks.ts";
import { explain } from "./session.ts";

/** States grouped by what they mean to a person: settled and fine, on the way, stopped, or needing a look. */
const TONE: Record<string, string> = {
  RUNNING: "ok",
  STOPPED: "idle",
  PAUSED: "idle",
  DELETED: "idle",
  ERROR: "bad",
  LOST: "bad",
  CREATING: "busy",
  DELETING: "busy",
  READY: "ok",
  DRAINING: "busy",
  CORDONED: "idle",
  INFO: "idle",
  WARNING: "warn",
};

export function Badge({ state, testId }: { state: string; testId?: string }) {
  return (
    <span class={`badge ${TONE[state] ?? "busy"}`} data-testid={testId} data-state={state}>
      {state.toLowerCase()}
    </span>
  );
}

export function ErrorNote({ error, onClose }: { error: unknown; onClose?: () => void }) {
  if (!error) return null;
  const { code, message } = explain(error);
  return (
    <div class="error" role="alert" data-code={code}>
      <code>{code}</code> {message}
      {onClose && (
        <button type="button" class="link" onClick={onClose} aria-label="dismiss">
          ×
        </button>
      )}
    </div>
  );
}

export function Empty({ children }: { children: ComponentChildren }) {
  return <p class="empty">{children}</p>;
}

export function Loading({ what }: { what: string }) {
  return <p class="muted">Loading {what}…</p>;
}

export function age(from: string | null | undefined, now: number): string {
  if (!from) return "never";
  const s = Math.max(0, Math.round((now - Date.parse(from)) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  if (s < 172_800) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86_400)}d`;
}

/** An age that keeps counting while it is on screen. */
export function Age({ from, suffix = " ago" }: { from: string | null | undefined; suffix?: string }) {
  const now = useNow();
  return <time dateTime={from ?? undefined}>{from ? age(from, now) + suffix : "never"}</time>;
}

export function Bar({ used, total, label }: { used: number; total: number; label: string }) {
  const share = total > 0 ? Math.min(1, used / total) : 0;
  const tone = share >= 0.9 ? "bad" : share >= 0.7 ? "warn" : "ok";
  return (
    <div class="bar" title={`${label}: ${used} of ${total}`}>
      <div class="bar-label">
        <span>{label}</span>
        <span>
          {used} / {total}
        </span>
      </div>
      {/* biome-ignore lint/a11y/useSemanticElements: a native <meter> cannot take our tones the same way in every browser. */}
      <div class="bar-track" role="meter" aria-label={label} aria-valuenow={used} aria-valuemin={0} aria-valuemax={total}>
        <div class={`bar-fill ${tone}`} style={{ width: `${share * 100}%` }} />
      </div>
    </div>
  );
}

export const mib = (m: number) => (m >= 1024 ? `${+(m / 1024).toFixed(1)} GiB` : `${m} MiB`);

/**
 * A button that asks before it acts, in a modal dialog, and shows the API's refusal in place. The action runs
 * once per confirmation; the button stays disabled while it runs.
 */
export function ConfirmButton(props: { label: string; question: string; action: () => Promise<unknown>; danger?: boolean; disabled?: boolean }) {
  const dialog = useRef<HTMLDialogElement>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>();
  const confirm = async () => {
    dialog.current?.close();
    setBusy(true);
    setError(undefined);
    try {
      await props.action();
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  return (
    <span class="confirm">
      <button type="button" class={props.danger ? "danger" : ""} disabled={props.disabled || busy} onClick={() => dialog.current?.showModal()}>
        {props.label}
      </button>
      <dialog ref={dialog} aria-label={props.question}>
        <p>{props.question}</p>
        <div class="row end">
          <button type="button" onClick={() => dialog.current?.close()}>
            Cancel
          </button>
          <button type="button" class={props.danger ? "danger" : "primary"} onClick={confirm}>
            {props.label}
          </button>
        </div>
      </dialog>
      <ErrorNote error={error} onClose={() => setError(undefined)} />
    </span>
  );
}

export function Section({ title, actions, children }: { title: string; actions?: ComponentChildren; children: ComponentChildren }) {
  return (
    <section>
      <header class="section-head">
        <h2>{title}</h2>
        {actions && <div class="row">{actions}</div>}
      </header>
      {children}
    </section>
  );
}
