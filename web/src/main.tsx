import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { href, useRoute } from "./hooks.ts";
import { keepToken, type Session, SessionContext, savedToken, signIn, useSession } from "./session.ts";
import "./style.css";
import { ErrorNote } from "./ui.tsx";
import { FleetView } from "./views/fleet.tsx";
import { InstanceView } from "./views/instance.tsx";
import { InstancesView } from "./views/instances.tsx";
import { DoctorView, ProvidersView } from "./views/operator.tsx";
import { SandboxesView, SandboxView } from "./views/sandboxes.tsx";
import { UsageView } from "./views/usage.tsx";
import { WarmPools } from "./views/warm.tsx";

const TENANT_VIEWS = [
  ["instances", "Instances"],
  ["sandboxes", "Sandboxes"],
  ["usage", "Usage"],
] as const;
const OPERATOR_VIEWS = [
  ["fleet", "Pools & hosts"],
  ["providers", "Providers"],
  ["warm", "Warm pools"],
  ["doctor", "Doctor"],
] as const;

function App() {
  const [session, setSession] = useState<Session | null>(null);
  const [checking, setChecking] = useState(Boolean(savedToken()));
  const [error, setError] = useState<unknown>();
  const enter = async (token: string) => {
    setError(undefined);
    try {
      const s = await signIn(token.trim());
      keepToken(s.token);
      setSession(s);
    } catch (e) {
      keepToken(null);
      setError(e);
    } finally {
      setChecking(false);
    }
  };
  useEffect(() => {
    const saved = savedToken();
    if (saved) void enter(saved);
  }, []);
  if (checking) return <p class="muted center">Signing in…</p>;
  if (!session) return <SignIn onToken={enter} error={error} />;
  return (
    <SessionContext.Provider value={session}>
      <Shell
        onSignOut={() => {
          keepToken(null);
          setSession(null);
        }}
      />
    </SessionContext.Provider>
  );
}

function SignIn({ onToken, error }: { onToken: (t: string) => void; error: unknown }) {
  const [token, setToken] = useState("");
  return (
    <main class="signin">
      <h1>Better Compute</h1>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          onToken(token);
        }}
      >
        <label>
          API token
          <input type="password" name="token" autoComplete="off" value={token} onInput={(e) => setToken(e.currentTarget.value)} required />
        </label>
        <button type="submit" class="primary">
          Sign in
        </button>
      </form>
      <ErrorNote error={error} />
      <p class="muted">
        A tenant's API token, or the operator token. <code>npm start</code> prints both. The API itself is at <a href="/graphql">/graphql</a>.
      </p>
    </main>
  );
}

function Shell({ onSignOut }: { onSignOut: () => void }) {
  const route = useRoute();
  const session = useSession();
  const operator = session.viewer.isOperator;
  const views = [...TENANT_VIEWS, ...(operator ? OPERATOR_VIEWS : [])];
  const [top = "instances", id] = route;
  return (
    <>
      <header class="top">
        <a class="brand" href={href("instances")}>
          Better Compute
        </a>
        <nav>
          {views.map(([k, label]) => (
            <a key={k} href={href(k)} aria-current={k === top ? "page" : undefined}>
              {label}
            </a>
          ))}
        </nav>
        <span class="who muted" data-testid="who">
          {operator ? "operator" : session.viewer.tenantId}
        </span>
        <button type="button" class="link" onClick={onSignOut}>
          Sign out
        </button>
      </header>
      <main>
        <View top={top} id={id} operator={operator} />
      </main>
    </>
  );
}

function View({ top, id, operator }: { top: string; id?: string; operator: boolean }) {
  if (top === "instances") return id ? <InstanceView id={id} /> : <InstancesView />;
  if (top === "sandboxes") return id ? <SandboxView id={id} /> : <SandboxesView />;
  if (top === "usage") return <UsageView />;
  if (operator && top === "fleet") return <FleetView />;
  if (operator && top === "providers") return <ProvidersView />;
  if (operator && top === "warm") return <WarmPools />;
  if (operator && top === "doctor") return <DoctorView />;
  return <p class="empty">Nothing here. Pick a view above.</p>;
}

const root = document.getElementById("app");
if (root) render(<App />, root);
