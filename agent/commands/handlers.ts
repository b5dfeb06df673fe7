import type { HostCommandKind } from "../../contracts/commands.ts";
import { execHandler } from "./exec.ts";
import type { CommandHandler } from "./handler.ts";
import { powerHandler } from "./power.ts";
import { restoreHandler, snapshotHandler } from "./snapshot.ts";

/**
 * The agent's side of each host command kind: its handler, by kind. It covers exactly the kinds of the contracts'
 * table (contracts/commands.ts): a kind missing here is a compile error, and tests/unit/command-kinds.test.ts
 * checks it against the server's table (core/commands/kinds.ts) too.
 */
export const handlers: { [K in HostCommandKind]: CommandHandler<K> } = {
  "instance.snapshot": snapshotHandler,
  "instance.restore": restoreHandler,
  "instance.exec": execHandler,
  "instance.pause": powerHandler,
  "instance.resume": powerHandler,
};

export const handlerOf = <K extends HostCommandKind>(kind: K): CommandHandler<K> => handlers[kind];
