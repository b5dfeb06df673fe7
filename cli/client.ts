import { Command } from "commander";
import * as bc from "../sdk/client.ts";
import { clientConfigPath, clientSettings, saveClientSettings } from "./config.ts";

/**
 * `bc` for people and scripts: instances, sandboxes, pools, nodes, usage, tokens and the doctor through the API, as tables
 * (or `--json`), with exit codes that name the failure. Built on commander; the URL and token come from flags,
 * the environment or what `bc login` saved (./config.ts).
 */

/** Exit codes by the API's error code: a script can branch on them without reading the message. */
const EXIT: Record<string, number> = {
  INVALID_INPUT: 2,
  NOT_FOUND: 3,
  UNAUTHENTICATED: 4,
  FORBIDDEN: 4,
  PRECONDITION_FAILED: 5,
  CONFLICT: 5,
  QUOTA_EXCEEDED: 6,
  UNSCHEDULABLE: 6,
  RATE_LIMITED: 7,
};

type Global = { url?: string; token?: string; json?: boolean };
const out = (s: string) => void process.stdout.write(s);

/** Columns padded to their widest cell; the first row is the header. */
export function table(rows: (string | number | null | undefined)[][]): string {
  const cells = rows.map((r) => r.map((c) => (c === null || c === undefined || c === "" ? "-" : String(c))));
  const widths = cells[0]?.map((_, i) => Math.max(...cells.map((r) => r[i]?.length ?? 0))) ?? [];
  return cells.map((r) => `${r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i] ?? 0))).join("  ")}\n`).join("");
}

const age = (d: string) => {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(d)) / 1000));
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.round(s / 60)}m` : s < 172_800 ? `${Math.round(s / 3600)}h` : `${Math.round(s / 86_400)}d`;
};

export function clientProgram(): Command {
  const program = new Command("bc")
    .option("--url <url>", "the API (default: BC_URL, then what bc login saved)")
    .option("--token <token>", "the bearer token (default: BC_TOKEN, then what bc login saved)")
    .option("--json", "print JSON for scripts instead of tables")
    .showHelpAfterError();
  const g = () => program.opts<Global>();
  const client = () => bc.createClient(clientSettings(g()));
  const print = <T>(value: T, human: (v: T) => string) => out(g().json ? `${JSON.stringify(value, null, 2)}\n` : human(value));

  program
    .command("login")
    .description("check --url and --token against the API and save them for the next commands")
    .action(async () => {
      const { url, token } = g();
      if (!url || !token) program.error("bc login needs --url and --token");
      const o = { url: url as string, token: token as string };
      const { viewer } = await bc.createClient(o).request(bc.ViewerDocument);
      const path = clientConfigPath();
      saveClientSettings(path, o);
      print(viewer, (v) => `logged in to ${o.url} as ${v.identityId}${v.isOperator ? " (operator)" : ""}; saved in ${path}\n`);
    });

  const instances = program.command("instances").description("instances: list, get, create, start, stop, delete, watch");
  const instanceRows = (list: bc.InstanceFieldsFragment[]) =>
    table([
      ["ID", "STATE", "DESIRED", "FLAVOR", "ADDRESSES", "AGE"],
      ...list.map((i) => [i.id, i.state, i.desiredState, i.flavor, i.addresses.join(","), age(i.createdAt)]),
    ]);
  instances
    .command("list")
    .option("--pool <id>")
    .action(async (o: { pool?: string }) => {
      const { instances: page } = await client().request(bc.InstancesDocument, { poolId: o.pool ?? null, first: 500 });
      const list = page.edges.map((e) => e.node);
      print(list, (l) => (l.length ? instanceRows(l) : "no instances\n"));
    });
  instances.command("get <id>").action(async (id: string) => {
    const { instance } = await client().request(bc.InstanceDocument, { id });
    if (!instance) throw new bc.SdkError([{ message: `no instance ${id}`, extensions: { code: "NOT_FOUND" } }]);
    print(instance, (i) =>
      table([
        ["FIELD", "VALUE"],
        ["id", i.id],
        ["state", i.state],
        ["desired", i.desiredState],
        ["flavor", `${i.flavor} (${i.vcpus} vCPU, ${i.memoryMib} MiB, ${i.diskGib} GiB)`],
        ["addresses", i.addresses.join(", ")],
        ["node", i.nodeId],
        ["conditions", i.conditions.map((c) => `${c.type}/${c.reason}: ${c.message}`).join("; ")],
        ["created", i.createdAt],
      ]),
    );
  });
  instances
    .command("create")
    .requiredOption("--pool <id>")
    .requiredOption("--flavor <name>")
    .requiredOption("--image <id>")
    .option("--stopped", "create it stopped")
    .option("--key <idempotencyKey>")
    .option("--wait", "follow its state until it settles, showing each step")
    .action(async (o: { pool: string; flavor: string; image: string; stopped?: boolean; key?: string; wait?: boolean }) => {
      const c = client();
      const { createInstance: made } = await c.request(bc.CreateInstanceDocument, {
        input: { poolId: o.pool, flavor: o.flavor, imageId: o.image, desiredState: o.stopped ? "STOPPED" : "RUNNING", idempotencyKey: o.key ?? null },
      });
      if (!o.wait) return print(made, (i) => `${i.id} ${i.state}\n`);
      const settled = await follow(c, made.id, o.stopped ? "STOPPED" : "RUNNING");
      print(settled, (i) => `${i.id} ${i.state}\n`);
      if (settled.state !== (o.stopped ? "STOPPED" : "RUNNING")) process.exitCode = 1;
    });
  for (const [verb, doc] of [
    ["start", bc.StartInstanceDocument],
    ["stop", bc.StopInstanceDocument],
    ["delete", bc.DeleteInstanceDocument],
  ] as const)
    instances.command(`${verb} <id>`).action(async (id: string) => {
      const data = (await client().request(doc as typeof bc.StartInstanceDocument, { id })) as Record<string, bc.InstanceFieldsFragment>;
      print(Object.values(data)[0] as bc.InstanceFieldsFragment, (i) => `${i.id} ${i.state} (desired ${i.desiredState})\n`);
    });
  instances
    .command("watch")
    .description("print every state change as it happens (Ctrl-C to stop)")
    .option("--pool <id>")
    .action(async (o: { pool?: string }) => {
      for await (const e of bc.watchInstanceEvents({ ...clientSettings(g()), ...(o.pool ? { poolId: o.pool } : {}) }))
        out(g().json ? `${JSON.stringify(e)}\n` : `${e.at}  ${e.instance.id}  ${e.fromState ?? "-"} -> ${e.toState}  (${e.reason})\n`);
    });

  const sandboxes = program.command("sandboxes").description("sandboxes: list, get, create, delete");
  sandboxes.command("list").action(async () => {
    const { sandboxes: list } = await client().request(bc.SandboxesDocument, { first: 500 });
    print(list, (l) =>
      l.length
        ? table([["ID", "STATE", "TEMPLATE", "WARM", "EXPIRES"], ...l.map((s) => [s.id, s.state, s.templateId, s.warm ? "yes" : "no", s.expiresAt])])
        : "no sandboxes\n",
    );
  });
  sandboxes.command("get <id>").action(async (id: string) => {
    const { sandbox } = await client().request(bc.SandboxDocument, { id });
    if (!sandbox) throw new bc.SdkError([{ message: `no sandbox ${id}`, extensions: { code: "NOT_FOUND" } }]);
    print(sandbox, (s) =>
      table([
        ["ID", "STATE", "INSTANCE", "EXPIRES"],
        [s.id, s.state, s.instance.id, s.expiresAt],
      ]),
    );
  });
  sandboxes
    .command("create")
    .option("--template <id>")
    .option("--snapshot <id>")
    .option("--ttl <seconds>", "time to live", (v) => Number(v))
    .action(async (o: { template?: string; snapshot?: string; ttl?: number }) => {
      const { createSandbox: s } = await client().request(bc.CreateSandboxDocument, {
        input: { templateId: o.template ?? null, snapshotId: o.snapshot ?? null, ttlSeconds: o.ttl ?? null },
      });
      print(s, (x) => `${x.id} ${x.state}${x.warm ? " (warm)" : ""}\n`);
    });
  sandboxes.command("delete <id>").action(async (id: string) => {
    const { deleteSandbox: s } = await client().request(bc.DeleteSandboxDocument, { id });
    print(s, (x) => `${x.id} ${x.state}\n`);
  });

  program.command("pools").action(async () => {
    const { pools } = await client().request(bc.PoolsDocument);
    print(pools, (l) =>
      table([
        ["ID", "NAME", "CLASS", "RUNTIME", "RANGE", "LEASED"],
        ...l.map((p) => [p.id, p.name, p.class, p.runtime, p.ipam?.range, p.ipam ? `${p.ipam.used}/${p.ipam.total}` : null]),
      ]),
    );
  });
  program.command("nodes <poolId>").action(async (poolId: string) => {
    const { nodes } = await client().request(bc.NodesDocument, { poolId });
    print(nodes, (l) =>
      table([
        ["ID", "NAME", "STATE", "VCPU", "MEMORY MIB", "LAST REPORT"],
        ...l.map((n) => [
          n.id,
          n.name,
          n.state,
          `${n.allocated.vcpus}/${n.capacity.vcpus}`,
          `${n.allocated.memoryMib}/${n.capacity.memoryMib}`,
          n.lastReportAt ? age(n.lastReportAt) : null,
        ]),
      ]),
    );
  });
  program
    .command("usage")
    .requiredOption("--from <time>", "RFC 3339")
    .requiredOption("--to <time>", "RFC 3339")
    .option("--tenant <id>")
    .option("--group-by <groups>", "comma-separated: tenant, project, instance, meter, hour, day", "tenant")
    .action(async (o: { from: string; to: string; tenant?: string; groupBy: string }) => {
      const groupBy = o.groupBy
        .split(",")
        .filter(Boolean)
        .map((x) => x.trim().toUpperCase()) as bc.UsageGroup[];
      const { usage } = await client().request(bc.UsageDocument, { from: o.from, to: o.to, tenantId: o.tenant ?? null, groupBy });
      print(usage, (l) =>
        l.length
          ? table([
              ["START", "METER", "TENANT", "PROJECT", "INSTANCE", "QUANTITY", "UNIT"],
              ...l.map((r) => [r.start, r.meter, r.tenantId, r.projectId, r.instanceId, r.quantity.toFixed(4), r.unit]),
            ])
          : "no usage\n",
      );
    });
  program
    .command("doctor")
    .description("what an operator should fix, most severe first; exits 1 while any finding is an error")
    .action(async () => {
      const order = { ERROR: 0, WARNING: 1, INFO: 2 } as const;
      const findings = (await client().request(bc.DoctorDocument)).doctor.toSorted((a, b) => order[a.severity] - order[b.severity] || a.id.localeCompare(b.id));
      print(findings, (l) =>
        l.length ? l.map((f) => `${f.severity.padEnd(7)} ${f.id}  ${f.subject}\n        ${f.message}\n        fix: ${f.hint}\n`).join("") : "no findings\n",
      );
      if (findings.some((f) => f.severity === "ERROR")) process.exitCode = 1;
    });
  const tokens = program.command("tokens").description("API tokens (operators): create, revoke");
  tokens
    .command("create")
    .requiredOption("--tenant <id>")
    .requiredOption("--name <name>")
    .action(async (o: { tenant: string; name: string }) => {
      const { createApiToken: t } = await client().request(bc.CreateApiTokenDocument, { input: { tenantId: o.tenant, name: o.name } });
      print(t, (x) => `${x.apiToken.id}\n${x.token}\n`);
    });
  tokens.command("revoke <id>").action(async (id: string) => {
    const { revokeApiToken: t } = await client().request(bc.RevokeApiTokenDocument, { id });
    print(t, (x) => `${x.id} revoked ${x.revokedAt}\n`);
  });
  return program;
}

/** Poll the instance, printing each state it passes through with the time since the call, until `want` or an error. */
async function follow(c: bc.Client, id: string, want: string): Promise<bc.InstanceFieldsFragment> {
  const t0 = Date.now();
  let last = "";
  for (;;) {
    const { instance } = await c.request(bc.InstanceDocument, { id });
    if (!instance) throw new bc.SdkError([{ message: `instance ${id} is gone`, extensions: { code: "NOT_FOUND" } }]);
    if (instance.state !== last) {
      process.stderr.write(`  ${instance.state.toLowerCase().padEnd(13)} ${((Date.now() - t0) / 1000).toFixed(1)}s\n`);
      last = instance.state;
    }
    if (instance.state === want || instance.state === "ERROR" || instance.state === "DELETED") return instance;
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Run the client program; an API error prints its code and message and exits with the code's number. */
export async function clientCommand(argv: string[]): Promise<void> {
  try {
    await clientProgram().parseAsync(argv, { from: "user" });
  } catch (e) {
    if (e instanceof bc.SdkError) {
      process.stderr.write(`error: ${e.message}\n`);
      process.exitCode = EXIT[e.code] ?? 1;
      return;
    }
    // The API unreachable, a token missing: said in a line, not a stack.
    const cause = (e as { cause?: { code?: string; message?: string } }).cause;
    process.stderr.write(`error: ${e instanceof Error ? e.message : String(e)}${cause ? ` (${cause.code ?? cause.message})` : ""}\n`);
    process.exitCode = 1;
  }
}
