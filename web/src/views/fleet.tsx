import { FleetDocument, type FleetQuery } from "../../../sdk/client.ts";
import { useQuery } from "../hooks.ts";
import { useSession } from "../session.ts";
import { Age, Badge, Bar, Empty, ErrorNote, Loading, Section } from "../ui.tsx";

type Node = FleetQuery["pools"][number]["nodes"][number];

/** Operators: every pool with its address range in use, and each host's capacity against what is allocated on it. */
export function FleetView() {
  const s = useSession();
  const fleet = useQuery(() => s.client.request(FleetDocument).then((r) => r.pools), [s], 5000);
  if (fleet.error && !fleet.data) return <ErrorNote error={fleet.error} />;
  if (!fleet.data) return <Loading what="pools" />;
  if (fleet.data.length === 0) return <Empty>No pools. Create one with the createPool mutation or `bc`.</Empty>;
  return (
    <>
      <ErrorNote error={fleet.error} />
      {fleet.data.map((p) => (
        <Section key={p.id} title={`Pool ${p.name}`}>
          <p class="muted">
            {p.class === "VPS_HOST" ? "hosted" : "provider"} · {p.runtime ?? p.agent}
            {p.singleTenant && " · single tenant"}
            {p.providerAccountId && ` · account ${p.providerAccountId}`}
          </p>
          {p.ipam && (
            <div class="narrow" data-testid={`ipam-${p.name}`}>
              <Bar used={p.ipam.used} total={p.ipam.total} label={`addresses in ${p.ipam.range}`} />
            </div>
          )}
          {p.class === "VPS_HOST" &&
            (p.nodes.length === 0 ? (
              <Empty>No hosts have joined this pool.</Empty>
            ) : (
              <div class="grid">
                {p.nodes.map((n) => (
                  <HostCard key={n.id} n={n} />
                ))}
              </div>
            ))}
        </Section>
      ))}
    </>
  );
}

function HostCard({ n }: { n: Node }) {
  const gpus = [...new Set([...n.capacity.gpus, ...n.allocated.gpus].map((g) => g.model))];
  const count = (list: Node["capacity"]["gpus"], model: string) => list.find((g) => g.model === model)?.count ?? 0;
  return (
    <article class="card" data-testid={`host-${n.name}`}>
      <header class="row between">
        <strong>{n.name}</strong>
        <Badge state={n.gone ? "DELETED" : n.state} />
      </header>
      <p class="muted">
        last report <Age from={n.lastReportAt} /> · {n.instances} instances · spec {n.reportedGeneration}/{n.specGeneration}
      </p>
      <Bar used={n.allocated.vcpus} total={n.capacity.vcpus} label="vCPU" />
      <Bar used={Math.round(n.allocated.memoryMib / 1024)} total={Math.round(n.capacity.memoryMib / 1024)} label="memory GiB" />
      <Bar used={n.allocated.diskGib} total={n.capacity.diskGib} label="disk GiB" />
      {gpus.map((m) => (
        <Bar key={m} used={count(n.allocated.gpus, m)} total={count(n.capacity.gpus, m)} label={`GPU ${m}`} />
      ))}
    </article>
  );
}
