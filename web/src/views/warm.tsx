import { SandboxTemplatesDocument } from "../../../sdk/client.ts";
import { useQuery } from "../hooks.ts";
import { useSession } from "../session.ts";
import { Bar, Empty, ErrorNote, Loading, Section } from "../ui.tsx";

/** Sandbox templates and their warm pools: how full each is, and how claims fare. Refreshed every few seconds. */
export function WarmPools() {
  const s = useSession();
  const t = useQuery(() => s.client.request(SandboxTemplatesDocument).then((r) => r.sandboxTemplates), [s], 5000);
  return (
    <Section title="Templates and warm pools">
      <ErrorNote error={t.error} />
      {!t.data ? (
        <Loading what="templates" />
      ) : t.data.length === 0 ? (
        <Empty>No sandbox templates.</Empty>
      ) : (
        <table class="cards">
          <thead>
            <tr>
              <th>Template</th>
              <th>Flavor</th>
              <th>Warm</th>
              <th>Warming</th>
              <th>Claims</th>
              <th>Hit rate</th>
              <th>Claim p50</th>
            </tr>
          </thead>
          <tbody>
            {t.data.map((x) => (
              <tr key={x.id} data-testid={`template-${x.name}`}>
                <td data-label="Template">
                  {x.name} <span class="muted">v{x.version}</span>
                </td>
                <td data-label="Flavor">{x.flavor}</td>
                <td data-label="Warm">
                  <Bar used={x.warm.ready} total={x.warm.target} label="ready" />
                </td>
                <td data-label="Warming">{x.warm.warming}</td>
                <td data-label="Claims">{`${x.warm.hits} warm / ${x.warm.claims}`}</td>
                <td data-label="Hit rate">{x.warm.hitRate === null || x.warm.hitRate === undefined ? "—" : `${Math.round(x.warm.hitRate * 100)}%`}</td>
                <td data-label="Claim p50">{x.warm.claimP50Ms === null || x.warm.claimP50Ms === undefined ? "—" : `${Math.round(x.warm.claimP50Ms)} ms`}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </Section>
  );
}
