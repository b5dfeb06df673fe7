import { useState } from "preact/hooks";
import { UsageDocument, type UsageQuery } from "../../../sdk/client.ts";
import { useQuery } from "../hooks.ts";
import { useSession } from "../session.ts";
import { Empty, ErrorNote, Loading, Section } from "../ui.tsx";

const RANGES = {
  "24h": { hours: 24, step: "HOUR", stepMs: 3600_000 },
  "7d": { hours: 7 * 24, step: "DAY", stepMs: 86_400_000 },
  "30d": { hours: 30 * 24, step: "DAY", stepMs: 86_400_000 },
} as const;
type Range = keyof typeof RANGES;
type Row = UsageQuery["usage"][number];

/** Usage over time from the metered 5-minute windows, one meter at a time (units differ between meters). */
export function UsageView() {
  const s = useSession();
  const [range, setRange] = useState<Range>("24h");
  const r = RANGES[range];
  // Buckets are whole UTC hours or days, the last one the current.
  const to = Math.ceil(Date.now() / r.stepMs) * r.stepMs;
  const from = to - r.hours * 3600_000;
  const usage = useQuery(
    () =>
      s.client.request(UsageDocument, { from: new Date(from).toISOString(), to: new Date(to).toISOString(), groupBy: [r.step, "METER"] }).then((x) => x.usage),
    [s, range, to],
    60_000,
  );
  const meters = [...new Set(usage.data?.map((u) => u.meter) ?? [])].sort();
  const [picked, setPicked] = useState<string | null>(null);
  const meter = picked && meters.includes(picked) ? picked : (meters[0] ?? null);
  return (
    <Section
      title="Usage"
      actions={Object.keys(RANGES).map((k) => (
        <button key={k} type="button" class={k === range ? "primary" : ""} aria-pressed={k === range} onClick={() => setRange(k as Range)}>
          {k}
        </button>
      ))}
    >
      <ErrorNote error={usage.error} />
      {!usage.data ? (
        <Loading what="usage" />
      ) : meters.length === 0 || !meter ? (
        <Empty>No metered usage in this range. Usage is counted in 5-minute windows, a minute after each ends.</Empty>
      ) : (
        <>
          <div class="row tabs" role="tablist">
            {meters.map((m) => (
              <button key={m} type="button" role="tab" aria-selected={m === meter} class={m === meter ? "primary" : ""} onClick={() => setPicked(m)}>
                {m}
              </button>
            ))}
          </div>
          <Chart rows={usage.data.filter((u) => u.meter === meter)} from={from} to={to} stepMs={r.stepMs} />
          <Totals rows={usage.data} />
        </>
      )}
    </Section>
  );
}

function Chart({ rows, from, to, stepMs }: { rows: Row[]; from: number; to: number; stepMs: number }) {
  const buckets: { at: number; q: number }[] = [];
  for (let at = from; at < to; at += stepMs) buckets.push({ at, q: 0 });
  for (const u of rows) {
    const b = buckets[Math.floor((Date.parse(u.start ?? "") - from) / stepMs)];
    if (b) b.q += u.quantity;
  }
  const max = Math.max(...buckets.map((b) => b.q), 1e-9);
  const W = 720;
  const H = 200;
  const bw = W / buckets.length;
  const unit = rows[0]?.unit ?? "";
  const label = (at: number) => (stepMs < 86_400_000 ? new Date(at).toISOString().slice(11, 16) : new Date(at).toISOString().slice(5, 10));
  return (
    <figure class="chart">
      <svg viewBox={`0 0 ${W} ${H + 20}`} role="img" aria-label={`usage in ${unit}`} data-testid="usage-chart">
        {buckets.map((b, n) => {
          const h = (b.q / max) * H;
          return (
            <g key={b.at}>
              <rect x={n * bw + 1} y={H - h} width={Math.max(1, bw - 2)} height={h} class="chart-bar">
                <title>{`${new Date(b.at).toISOString().slice(0, 16).replace("T", " ")} UTC: ${b.q.toFixed(4)} ${unit}`}</title>
              </rect>
              {n % Math.ceil(buckets.length / 8) === 0 && (
                <text x={n * bw + bw / 2} y={H + 15} text-anchor="middle" class="chart-axis">
                  {label(b.at)}
                </text>
              )}
            </g>
          );
        })}
      </svg>
      <figcaption class="muted">{`peak ${max.toFixed(4)} ${unit} per ${stepMs < 86_400_000 ? "hour" : "day"} (UTC)`}</figcaption>
    </figure>
  );
}

function Totals({ rows }: { rows: Row[] }) {
  const sums = new Map<string, { q: number; unit: string }>();
  for (const u of rows) sums.set(u.meter, { q: (sums.get(u.meter)?.q ?? 0) + u.quantity, unit: u.unit });
  return (
    <table>
      <thead>
        <tr>
          <th>Meter</th>
          <th>Total</th>
        </tr>
      </thead>
      <tbody>
        {[...sums].map(([m, t]) => (
          <tr key={m}>
            <td>{m}</td>
            <td>{`${t.q.toFixed(4)} ${t.unit}`}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}
