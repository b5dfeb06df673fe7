import { z } from "zod";
import {
  type CreateMachine,
  type Machine,
  type ProviderContext,
  ProviderError,
  type ProviderOffer,
  type ProviderSession,
} from "../../core/pools/provider/contract.ts";
import { fail, tidy } from "./errors.ts";
import { HcloudHttp } from "./http.ts";
import { type Action, actionSchema, INSTANCE_LABEL, MANAGED_BY_LABEL, offerable, serverSchema, serverTypeSchema, toMachine } from "./shapes.ts";
import { registerKeys } from "./ssh-keys.ts";

export const DEFAULT_ENDPOINT = "https://api.hetzner.cloud/v1";

export interface HetznerConfig {
  endpoint?: string;
  location?: string;
}

const oneServer = z.object({ server: serverSchema });
const serverList = z.object({ servers: z.array(serverSchema) });
const created = z.object({ server: serverSchema, action: actionSchema.nullish(), next_actions: z.array(actionSchema).nullish() });
const actionAnswer = z.object({ action: actionSchema.nullish() }).optional();

/** Hetzner server ids are integers; anything else names no server there. */
const isServerId = (id: string) => /^[1-9][0-9]{0,17}$/.test(id);

/** Actions run on after the call returns; one that is already `error` would otherwise go unnoticed. */
function checkActions(what: string, actions: (Action | null | undefined)[]): void {
  for (const a of actions) {
    if (a?.status !== "error") continue;
    const code = a.error?.code ?? "action_failed";
    throw fail("transient", what, `${code}: action ${a.command ?? a.id} failed${a.error?.message ? `: ${tidy(a.error.message)}` : ""}`, { code });
  }
}

/** A session on one Hetzner Cloud project (the token's), labelling what it makes with the instance and `managedBy`. */
export function connectHetzner(config: HetznerConfig, ctx: ProviderContext): ProviderSession {
  const http = new HcloudHttp((config.endpoint ?? DEFAULT_ENDPOINT).replace(/\/+$/, ""), ctx);

  const get = async (externalId: string): Promise<Machine | null> => {
    if (!isServerId(externalId)) return null;
    const answer = await http.call("GET", `/servers/${externalId}`, { schema: oneServer, missingOk: true });
    return answer ? toMachine(answer.server) : null;
  };

  const find = async (instanceId: string): Promise<Machine | null> => {
    const query: [string, string][] = [
      ["label_selector", `${INSTANCE_LABEL}==${instanceId}`],
      ["sort", "id:asc"],
      ["per_page", "50"],
    ];
    const { servers } = await http.call("GET", "/servers", { query, schema: serverList });
    const oldest = servers.reduce<(typeof servers)[number] | undefined>((a, s) => (a && a.id < s.id ? a : s), undefined);
    return oldest ? toMachine(oldest) : null;
  };

  /** On `uniqueness_error` the name is taken: ours from an earlier attempt whose answer was lost, or someone else's. */
  const adoptByName = async (req: CreateMachine): Promise<Machine> => {
    const { servers } = await http.call("GET", "/servers", { query: [["name", req.name]], schema: serverList });
    const holder = servers.find((s) => s.name === req.name);
    if (holder?.labels?.[INSTANCE_LABEL] === req.instanceId) return toMachine(holder);
    if (holder) {
      throw fail("invalid", "POST /servers", `uniqueness_error (409): the name ${req.name} belongs to a server that is not this instance's`, {
        code: "uniqueness_error",
      });
    }
    throw fail("transient", "POST /servers", `uniqueness_error (409): the name ${req.name} was taken but is free now`, { code: "uniqueness_error" });
  };

  const power = async (externalId: string, action: "poweron" | "poweroff", done: Machine["status"][]): Promise<void> => {
    const what = `POST /servers/${externalId}/actions/${action}`;
    const machine = await get(externalId);
    if (!machine) throw fail("invalid", what, `not_found (404): there is no server ${externalId}`, { code: "not_found" });
    if (done.includes(machine.status)) return;
    const answer = await http.call("POST", `/servers/${externalId}/actions/${action}`, { schema: actionAnswer });
    checkActions(what, [answer?.action]);
  };

  return {
    async offers(): Promise<ProviderOffer[]> {
      const types = await http.all("/server_types", [], "server_types", serverTypeSchema);
      return types
        .filter((t) => offerable(t, config.location))
        .map((t) => ({ name: t.name, vcpus: t.cores, memoryMib: Math.round(t.memory * 1024), diskGib: t.disk }));
    },

    async create(req: CreateMachine): Promise<Machine> {
      // Hetzner has no idempotency keys: the label is what makes a repeated create find the first one's server.
      const existing = await find(req.instanceId);
      if (existing) return existing;
      const sshKeys = await registerKeys(http, req.sshKeys, ctx.managedBy);
      const body = {
        name: req.name,
        server_type: req.offer,
        image: req.image,
        ...(config.location ? { location: config.location } : {}),
        ...(sshKeys.length ? { ssh_keys: sshKeys } : {}),
        ...(req.userData !== null ? { user_data: req.userData } : {}),
        start_after_create: req.start,
        labels: { [INSTANCE_LABEL]: req.instanceId, [MANAGED_BY_LABEL]: ctx.managedBy },
      };
      let answer: z.infer<typeof created>;
      try {
        answer = await http.call("POST", "/servers", { body, schema: created });
      } catch (e) {
        if (e instanceof ProviderError && e.code === "uniqueness_error") return adoptByName(req);
        throw e;
      }
      checkActions("POST /servers", [answer.action, ...(answer.next_actions ?? [])]);
      return toMachine(answer.server);
    },

    get,
    find,

    start: (externalId) => power(externalId, "poweron", ["running", "starting"]),
    stop: (externalId) => power(externalId, "poweroff", ["stopped", "stopping"]),

    async delete(externalId: string): Promise<void> {
      if (!isServerId(externalId)) return;
      const what = `DELETE /servers/${externalId}`;
      try {
        const answer = await http.call("DELETE", `/servers/${externalId}`, { schema: actionAnswer, missingOk: true });
        checkActions(what, [answer?.action]);
      } catch (e) {
        // A server busy with its own removal is locked against a second one; that is the outcome we asked for.
        if (!(e instanceof ProviderError && e.code === "locked")) throw e;
        const now = await get(externalId);
        if (now && now.status !== "deleting") throw e;
      }
    },

    async list(): Promise<Machine[]> {
      const servers = await http.all("/servers", [["label_selector", `${MANAGED_BY_LABEL}==${ctx.managedBy}`]], "servers", serverSchema);
      return servers.map(toMachine);
    },

    pace: () => http.pace(),
  };
}
