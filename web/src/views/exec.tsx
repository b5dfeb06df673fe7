import { useRef, useState } from "preact/hooks";
import { createWsClient, SandboxExecDocument } from "../../../sdk/client.ts";
import { useSession } from "../session.ts";
import { ErrorNote, Section } from "../ui.tsx";

interface Piece {
  stream: "STDOUT" | "STDERR" | "EXIT";
  text: string;
}

/** Runs a shell command in the sandbox and shows stdout and stderr as they arrive, then how it ended. */
export function ExecConsole({ sandboxId, ready }: { sandboxId: string; ready: boolean }) {
  const s = useSession();
  const [command, setCommand] = useState("uname -a");
  const [output, setOutput] = useState<Piece[]>([]);
  const [running, setRunning] = useState(false);
  const [error, setError] = useState<unknown>();
  const stop = useRef<(() => void) | null>(null);
  const run = async (e: Event) => {
    e.preventDefault();
    setOutput([]);
    setError(undefined);
    setRunning(true);
    const ws = await createWsClient({ url: s.url, token: s.token, retryAttempts: 0 });
    stop.current = () => void ws.dispose();
    const seen: Piece[] = [];
    try {
      for await (const { sandboxExec: o } of ws.subscribe(SandboxExecDocument, { sandboxId, command: ["sh", "-c", command], timeoutSeconds: 60 })) {
        if (o.stream === "EXIT") {
          const how = o.timedOut ? "timed out" : o.signal ? `killed by ${o.signal}` : `exit code ${o.exitCode}`;
          seen.push({ stream: "EXIT", text: how });
        } else seen.push({ stream: o.stream, text: o.data ?? "" });
        setOutput([...seen]);
      }
    } catch (err) {
      setError(err);
    } finally {
      setRunning(false);
      stop.current = null;
      void ws.dispose();
    }
  };
  return (
    <Section title="Run a command">
      <form class="row exec" onSubmit={run}>
        <input aria-label="command" value={command} onInput={(e) => setCommand(e.currentTarget.value)} spellcheck={false} />
        <button type="submit" class="primary" disabled={!ready || running || !command.trim()}>
          Run
        </button>
        {running && (
          <button type="button" onClick={() => stop.current?.()}>
            Stop watching
          </button>
        )}
      </form>
      {!ready && <p class="muted">Commands run once the sandbox is running.</p>}
      <ErrorNote error={error} />
      <pre class="console" data-testid="exec-output" aria-live="polite">
        {output.map((p, n) => (
          <span key={n} class={p.stream.toLowerCase()}>
            {p.stream === "EXIT" ? `\n[${p.text}]` : p.text}
          </span>
        ))}
      </pre>
    </Section>
  );
}
