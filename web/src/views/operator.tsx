import { DoctorDocument, ProviderAccountDocument, ProviderAccountsDocument } from "../../../sdk/client.ts";
import { useQuery } from "../hooks.ts";
import { useSession } from "../session.ts";
import { Age, Badge, Empty, ErrorNote, Loading, Section } from "../ui.tsx";

const ORDER = { ERROR: 0, WARNING: 1, INFO: 2 } as const;

/** Operators: what needs fixing, most severe first, with the fix for each. */
export function DoctorView() {
  const s = useSession();
  const d = useQuery(() => s.client.request(DoctorDocument).then((r) => r.doctor), [s], 15_000);
  const findings = d.data?.toSorted((a, b) => ORDER[a.severity] - ORDER[b.severity] || a.id.localeCompare(b.id));
  return (
    <Section
      title="Doctor"
      actions={
        <button type="button" onClick={d.reload} disabled={d.loading}>
          Check again
        </button>
      }
    >
      <ErrorNote error={d.error} />
      {!findings ? (
        <Loading what="findings" />
      ) : findings.length === 0 ? (
        <Empty>Nothing to fix: pools, hosts, providers, warm pools and the books are in order.</Empty>
      ) : (
        <ul class="findings">
          {findings.map((f) => (
            <li key={`${f.id} ${f.subject}`} data-testid={`finding-${f.id}`} class={f.severity.toLowerCase()}>
              <div class="row">
                <Badge state={f.severity} />
                <code>{f.id}</code>
                <span class="muted">{f.subject}</span>
              </div>
              <p>{f.message}</p>
              <p class="hint">Fix: {f.hint}</p>
            </li>
          ))}
        </ul>
      )}
    </Section>
  );
}

/** Operators: provider accounts with the machine types each sells and the machines no instance explains. */
export function ProvidersView() {
  const s = useSession();
  const accounts = useQuery(
    async () => {
      const { providerAccounts } = await s.client.request(ProviderAccountsDocument);
      const full = await Promise.all(providerAccounts.map(async (a) => (await s.client.request(ProviderAccountDocument, { id: a.id })).providerAccount));
      return full.filter((a) => a !== null && a !== undefined);
    },
    [s],
    15_000,
  );
  return (
    <Section title="Provider accounts">
      <ErrorNote error={accounts.error} />
      {!accounts.data ? (
        <Loading what="provider accounts" />
      ) : accounts.data.length === 0 ? (
        <Empty>No provider accounts. Provider pools need one.</Empty>
      ) : (
        <table class="cards">
          <thead>
            <tr>
              <th>Account</th>
              <th>Provider</th>
              <th>Offers</th>
              <th>Orphans</th>
              <th>Created</th>
            </tr>
          </thead>
          <tbody>
            {accounts.data.map((a) => (
              <tr key={a.id} data-testid={`account-${a.name}`}>
                <td data-label="Account">
                  {a.name} <span class="muted">{a.id}</span>
                </td>
                <td data-label="Provider">{a.provider}</td>
                <td data-label="Offers">{a.offers.map((o) => o.name).join(", ") || "none yet"}</td>
                <td data-label="Orphans">{a.orphans.length ? `${a.orphans.length} machines no instance explains` : "none"}</td>
                <td data-label="Created">
                  <Age from={a.createdAt} />
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </Section>
  );
}
