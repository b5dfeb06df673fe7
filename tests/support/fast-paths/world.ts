import * as bc from "../../../sdk/client.ts";
import { sha256Of } from "../fixtures.ts";
import type { Harness } from "../harness.ts";
import { confirmDeleted, walk } from "../reconcile.ts";
import { FLAVORS, type Op, type WorldParams } from "./ops.ts";
import { byLabel, derivedLabels, normalise, runRows } from "./rows.ts";
import type { Side } from "./side.ts";

type Tenant = Awaited<ReturnType<Harness["tenant"]>>;

/**
 * One run's world on one side: two tenants (the owner, A, and another, B), a hosted pool of its own with joined
 * hosts and the standard flavors, a public and a private image, a project of each tenant. `k` numbers the run:
 * both sides give its pool the same range, so addresses compare as they are.
 */
export async function makeWorld(side: Side, p: WorldParams, k: number, opts: { namedReports: boolean }) {
  const { h } = side;
  const op = h.operator;
  const a = await h.tenant({ quota: p.quota });
  const b = await h.tenant();
  const { createPool: pool } = await op.request(bc.CreatePoolDocument, {
    input: { name: `fp-${k}`, class: "VPS_HOST", ipv4Range: `10.${100 + (k >> 8)}.${k & 255}.0/${p.prefix}`, singleTenant: p.singleTenant },
  });
  const nodes: { id: string; client: bc.Client }[] = [];
  for (const [i, cap] of p.nodes.entries()) {
    const { createJoinToken } = await op.request(bc.CreateJoinTokenDocument, { poolId: pool.id });
    const { joinNode } = await h.client().request(bc.JoinNodeDocument, { token: createJoinToken.token, name: `host-${i + 1}` });
    const client = h.client(joinNode.credential);
    await client.request(bc.ReportStatusDocument, { report: { generation: 0, instances: [], capacity: { ...cap, gpus: [] } } });
    nodes.push({ id: joinNode.nodeId, client });
  }
  const labels = new Map<string, string>([
    [a.id, "tenant:A"],
    [a.identityId, "idn:A"],
    [b.id, "tenant:B"],
    [b.identityId, "idn:B"],
    [pool.id, "pool"],
    ...nodes.map((n, i) => [n.id, `node:host-${i + 1}`] as [string, string]),
  ]);
  const flavorMade = (id: string, name: string) =>
    labels.set(id, `flavor:${name}#${[...labels.values()].filter((l) => l.startsWith(`flavor:${name}#`)).length}`);
  for (const f of FLAVORS) flavorMade((await op.request(bc.CreateFlavorDocument, { input: { poolId: pool.id, ...f } })).createFlavor.id, f.name);
  const image = (name: string, c: bc.Client, pub: boolean) =>
    c
      .request(bc.RegisterImageDocument, {
        input: { name, source: `https://images.invalid/${name}.qcow2`, sha256: sha256Of(pub ? "a" : "b"), format: "QCOW2", public: pub },
      })
      .then((r) => r.registerImage.id);
  const images = { public: await image("pub", op, true), private: await image("own", a.client, false) };
  const projects = {
    own: (await a.client.request(bc.CreateProjectDocument, { name: "own" })).createProject.id,
    other: (await b.client.request(bc.CreateProjectDocument, { name: "other" })).createProject.id,
  };
  labels.set(images.public, "image:public").set(images.private, "image:private").set(projects.own, "project:A").set(projects.other, "project:B");
  const [{ after }] = (await h.platform.read((sql) => sql.query(`SELECT COALESCE(max(id), 0)::text AS after FROM audit_log`))) as [{ after: string }];

  const tenants = { owner: a, other: b };
  const creates: { by: Tenant; input: Record<string, unknown> }[] = [];
  const instances: { id: string; owner: Tenant }[] = [];
  const tenantLabel = (id: string) => labels.get(id) ?? id;
  const read = <T>(text: string, params: unknown[]) => h.platform.read((sql) => sql.query<T>(text, params));

  async function create(by: Tenant, input: Record<string, unknown>) {
    creates.push({ by, input });
    const { createInstance: inst } = await by.client.request(bc.CreateInstanceDocument, { input: input as never });
    if (!instances.some((i) => i.id === inst.id)) instances.push({ id: inst.id, owner: by });
    return inst;
  }

  async function power(o: Extract<Op, { op: "power" }>) {
    const target = instances[o.target % instances.length];
    if (!target) return "no instance";
    const client = o.by === "operator" ? op : o.by === "other" ? (target.owner === a ? b : a).client : target.owner.client;
    const id = target.id;
    const asked =
      o.verb === "pause"
        ? (await client.request(bc.PauseInstanceDocument, { id })).pauseInstance
        : o.verb === "start"
          ? (await client.request(bc.StartInstanceDocument, { id })).startInstance
          : o.verb === "stop"
            ? (await client.request(bc.StopInstanceDocument, { id })).stopInstance
            : (await client.request(bc.DeleteInstanceDocument, { id })).deleteInstance;
    const [queued] = await read<{ id: string }>(`SELECT id FROM host_commands WHERE instance_id = $1 AND state = 'pending'`, [id]);
    if (!o.hostSays || !queued) return asked;
    return { asked, answered: await answer({ op: "answer", command: 0, state: o.hostSays, wrongName: false, otherNode: false }) };
  }

  async function host(o: Extract<Op, { op: "host" }>) {
    const target = instances[o.target % instances.length];
    if (!target) return "no instance";
    const [row] = await read<{ state: string; desired: string }>(`SELECT state, desired_state AS desired FROM instances WHERE id = $1`, [target.id]);
    if (!row) return "no row";
    if (row.desired === "deleted") {
      if (row.state !== "deleted") await confirmDeleted(h.platform, target.id);
      return "gone";
    }
    const boot: Record<string, string[]> = { provisioning: ["starting", "running"], starting: ["running"], stopped: ["starting", "running"] };
    const halt: Record<string, string[]> = { provisioning: ["stopped"], starting: ["stopped"], running: ["stopped"], paused: ["stopped"] };
    const path = (row.desired === "stopped" ? halt : boot)[row.state] ?? [];
    await walk(h.platform, target.id, path);
    return path;
  }

  async function answer(o: Extract<Op, { op: "answer" }>) {
    // Newest first, those the host has not finished ahead: 0 is what a host would answer next.
    const commands = await read<{ id: string; kind: string; instanceId: string; nodeId: string }>(
      `SELECT c.id, c.kind, c.instance_id AS "instanceId", c.node_id AS "nodeId" FROM host_commands c
        WHERE c.node_id = ANY($1::text[]) ORDER BY c.state IN ('pending', 'running') DESC, c.created_at DESC, c.id DESC`,
      [nodes.map((n) => n.id)],
    );
    const c = commands[o.command % Math.max(1, commands.length)];
    if (!c) return "no command";
    const from = (o.otherNode ? nodes.find((n) => n.id !== c.nodeId) : undefined) ?? (nodes.find((n) => n.id === c.nodeId) as (typeof nodes)[number]);
    const named = opts.namedReports && o.state !== "running" && (c.kind === "instance.pause" || c.kind === "instance.resume");
    const other = instances.find((i) => i.id !== c.instanceId)?.id ?? `inst_${"a".repeat(52)}`;
    const report = {
      id: c.id,
      state: o.state,
      result: o.state === "succeeded" ? {} : null,
      error: o.state === "failed" ? "the host could not" : null,
      ...(named ? { power: { kind: c.kind, instanceId: o.wrongName ? other : c.instanceId } } : {}),
    };
    return (await from.client.request(bc.ReportCommandDocument, { report })).reportCommand;
  }

  async function flavor(o: Extract<Op, { op: "flavor" }>) {
    const spec = FLAVORS[o.flavor] as (typeof FLAVORS)[number];
    if (o.change === "recreate") {
      const { createFlavor } = await op.request(bc.CreateFlavorDocument, { input: { poolId: pool.id, ...spec } });
      flavorMade(createFlavor.id, spec.name);
      return createFlavor;
    }
    const f = (await op.request(bc.FlavorsDocument, { poolId: pool.id })).flavors.find((x) => x.name === spec.name);
    if (!f) return "no flavor";
    if (o.change === "delete") return (await op.request(bc.DeleteFlavorDocument, { id: f.id })).deleteFlavor;
    const input = o.change === "grow" ? { vcpus: f.vcpus + 1, memoryMib: f.memoryMib + 1024 } : { vcpus: Math.max(1, f.vcpus - 1) };
    return (await op.request(bc.UpdateFlavorDocument, { id: f.id, input })).updateFlavor;
  }

  async function perform(o: Op): Promise<unknown> {
    switch (o.op) {
      case "create": {
        const input = {
          poolId: pool.id,
          flavor: FLAVORS[o.flavor]?.name ?? "xl",
          imageId: o.image === "missing" ? "img_missing" : images[o.image],
          ...(o.project === "none" ? {} : { projectId: projects[o.project] }),
          desiredState: o.desired,
          idempotencyKey: `k${o.key}`,
        };
        return create(tenants[o.by], input);
      }
      case "replay": {
        const again = creates[o.of % creates.length];
        return again ? create(again.by, again.input) : "no create";
      }
      case "power":
        return power(o);
      case "host":
        return host(o);
      case "release": {
        if (!instances.length) return "no instance";
        const asked = await power({ op: "power", verb: "delete", target: o.target, by: "owner", hostSays: null });
        return { asked, host: await host({ op: "host", target: o.target }) };
      }
      case "answer":
        return answer(o);
      case "flavor":
        return flavor(o);
      case "image":
        // Withdrawn behind the API's back (there is no mutation for it): nothing tells a remembered catalog.
        await read(`UPDATE images SET deleted_at = CASE WHEN $2 THEN now() END WHERE id = $1`, [images[o.which], o.withdrawn]);
        return o.withdrawn ? "withdrawn" : "restored";
      case "quota":
        return (await op.request(bc.SetTenantQuotaDocument, { tenantId: a.id, quota: { instances: o.instances, vcpus: o.vcpus } })).setTenantQuota.id;
      case "node": {
        const node = nodes[o.node % nodes.length] as (typeof nodes)[number];
        return (await op.request(bc.SetNodeStateDocument, { id: node.id, state: o.state })).setNodeState.state;
      }
    }
  }

  /** Reconcile passes in the order of the instances' labels, the same on both sides. */
  const inLabelOrder = async (ids: string[]) => {
    const keys = await read<{ id: string; tenantId: string; key: string }>(
      `SELECT id, tenant_id AS "tenantId", idempotency_key AS key FROM instances WHERE id = ANY($1::text[])`,
      [ids],
    );
    const label = new Map(keys.map((r) => [r.id, `${tenantLabel(r.tenantId)}:${r.key}`]));
    return [...ids].sort((x, y) => (label.get(x) ?? x).localeCompare(label.get(y) ?? y));
  };

  const answers: unknown[] = [];
  return {
    /** Run one operation, then the reconcile passes it asked for; its answer (or error) is kept. */
    async apply(o: Op): Promise<void> {
      let out: unknown;
      try {
        out = await perform(o);
      } catch (e) {
        const err = e as { code?: string; message?: string };
        out = { error: err.code ?? "thrown", message: err.message };
      }
      const passes = await side.drain(inLabelOrder);
      answers.push({ op: o, out, ...(passes.length ? { passes } : {}) });
    },
    /** The answers (each operation's, in order) and the rows, normalised: what must be equal across the two sides. */
    async result(): Promise<unknown> {
      const all = new Map([...labels, ...(await derivedLabels(h.platform, pool.id, tenantLabel))]);
      const rows = normalise(await runRows(h.platform, { poolId: pool.id, tenantIds: [a.id, b.id], auditAfter: after }), all) as Record<string, unknown[]>;
      return {
        answers: normalise(answers, all),
        rows: {
          ...rows,
          instances: byLabel(rows.instances as unknown[], "id"),
          events: byLabel(rows.events as unknown[], "instance"),
          allocations: byLabel(rows.allocations as unknown[], "instance_id"),
          spans: byLabel(rows.spans as unknown[], "allocation_id"),
          quota: byLabel(rows.quota as unknown[], "tenant_id"),
        },
      };
    },
  };
}
