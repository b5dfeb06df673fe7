/**
 * What one request costs the server's process, against the cheapest answer the same server gives.
 *
 *   npm run bench:request -- [--clients 16] [--seconds 6] [--warm 3]
 *
 * Clients in a child process send, each kind in turn, for `seconds` after `warm` seconds of the same: GET
 * /healthz (Node's HTTP and nothing else: the limit), `{ __typename }` (yoga's whole path, the credential and
 * the rate limit, no field of ours), `{ viewer { … } }`, and createInstance (admission, on a warm database). For
 * each it prints requests/s and the server process's CPU per request (user and system), and the GraphQL kinds
 * as multiples of /healthz's. Needs PostgreSQL and Redis.
 */
import { fork } from "node:child_process";
import { Agent, request as httpRequest } from "node:http";
import { fileURLToPath } from "node:url";
import { print } from "graphql";
import { CreateInstanceDocument } from "../sdk/client.ts";
import { post } from "../sdk/node-post.ts";
import { startServer } from "../server/app.ts";
import { hostedFixture } from "./fixture.ts";
import { benchArgs, benchPlatform, childPhase, type closedLoop, exitWhenDone, psql, warmThenMeasure } from "./lib.ts";

const args = benchArgs({ clients: 16, seconds: 6, warm: 3 });
const KINDS = ["healthz", "typename", "viewer", "create"] as const;
type Kind = (typeof KINDS)[number];
interface Plan {
  kind: Kind;
  url: string;
  token: string;
  poolId: string;
  imageId: string;
}
const ROLE = "REQUEST_CLIENTS";

async function clientProcess() {
  const agent = new Agent({ keepAlive: true });
  const health = (url: string) =>
    new Promise<void>((resolve, reject) => {
      const req = httpRequest(url.replace(/\/graphql$/, "/healthz"), { agent }, (res) => res.resume().on("end", resolve));
      req.on("error", reject).end();
    });
  const create = print(CreateInstanceDocument);
  for (;;) {
    const plan = await new Promise<Plan>((resolve) => process.once("message", (m) => resolve(m as Plan)));
    const body = (n: number) =>
      plan.kind === "create"
        ? { query: create, variables: { input: { poolId: plan.poolId, flavor: "small", imageId: plan.imageId, idempotencyKey: `${n}` } } }
        : { query: plan.kind === "viewer" ? "{ viewer { identityId tenantId scopes } }" : "{ __typename }" };
    const one = async (_: number, n: number) => {
      if (plan.kind === "healthz") return health(plan.url);
      const r = await post(plan.url, { "content-type": "application/json", authorization: `Bearer ${plan.token}` }, JSON.stringify(body(n)));
      if (r.status !== 200 || r.text.includes('"errors"')) throw new Error(r.text);
    };
    process.send?.(await warmThenMeasure(args.clients, args.warm, args.seconds, one));
  }
}

async function run() {
  console.log(`request bench: ${args.clients} clients, ${args.seconds} s per kind after ${args.warm} s of the same`);
  // A budget the clients cannot spend: the limiter still runs, as deployed.
  const { platform, databaseUrl, close } = await benchPlatform({ poolSize: args.clients + 2, env: { LIMIT_RATE_POINTS: "1000000000" } });
  const big = 1_000_000_000;
  const fx = await hostedFixture(platform, { nodes: 3, tenants: 1, quota: { instances: big, vcpus: big, memoryMib: big, diskGib: big }, hostRoom: 65_536 });
  const app = await startServer(platform, { port: 0, host: "127.0.0.1" });
  const child = fork(fileURLToPath(import.meta.url), process.argv.slice(2), { env: { ...process.env, [ROLE]: "1" } });
  try {
    let limit = 0;
    for (const kind of KINDS) {
      let cpu0 = process.cpuUsage();
      const plan: Plan = { kind, url: app.url, token: fx.tenants[0]?.token ?? "", poolId: fx.poolId, imageId: fx.imageId };
      const loop = await childPhase<Awaited<ReturnType<typeof closedLoop>>>(
        child,
        plan,
        () => {
          // Statistics as a database in service has them (bench/admission.ts says why).
          if (kind === "create") psql(databaseUrl as string, ["-c", "ANALYZE"]);
          cpu0 = process.cpuUsage();
        },
        { min: args.warm, max: args.warm },
      );
      const result = { ...loop, cpu: process.cpuUsage(cpu0) };
      const per = (micros: number) => micros / 1000 / result.done;
      const total = per(result.cpu.user + result.cpu.system);
      if (kind === "healthz") limit = total;
      console.log(
        `${kind.padEnd(9)} ${result.perSecond.toFixed(0).padStart(6)}/s  errors ${result.errors}  server CPU per request ${total.toFixed(3)} ms ` +
          `(system ${per(result.cpu.system).toFixed(3)})${kind === "healthz" ? "  the limit" : `  ${(total / limit).toFixed(1)}× /healthz`}`,
      );
    }
  } finally {
    child.kill();
    await app.close();
    await close();
  }
}

exitWhenDone(process.env[ROLE] ? clientProcess() : run());
