import type { HostCommandKind } from "../../contracts/commands.ts";
import type { ServerKind } from "./commands.ts";
import { execFinished } from "./exec.ts";
import { settlePower } from "./power.ts";
import { settleSnapshot, snapshotsGone } from "./snapshot.ts";

/**
 * The server's side of each host command kind, by kind: how its outcome settles and what follows its final word.
 * How each is queued is its module's (./power.ts, ./snapshot.ts, ./exec.ts), called by the hosted pools' driver.
 * It covers exactly the kinds of the contracts' table (contracts/commands.ts): a kind missing here is a compile
 * error, and tests/unit/command-kinds.test.ts checks it against the agent's table (agent/commands/handlers.ts) too.
 */
export const serverKinds: { [K in HostCommandKind]: ServerKind } = {
  "instance.snapshot": { settle: settleSnapshot, gone: snapshotsGone },
  "instance.restore": { settle: settleSnapshot, gone: snapshotsGone },
  // An exec changes nothing of the instance: its watchers have its output and its end.
  "instance.exec": { settle: async () => null, finished: execFinished },
  "instance.pause": { settle: settlePower },
  "instance.resume": { settle: settlePower },
};

/** What happens when an instance is deleted, once each (kinds of one family share it). */
export const goneHooks = [...new Set(Object.values(serverKinds).flatMap((k) => (k.gone ? [k.gone] : [])))];
