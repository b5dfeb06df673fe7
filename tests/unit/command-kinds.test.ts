import { describe, expect, it } from "vitest";
import { handlers } from "../../agent/commands/handlers.ts";
import { type CommandKind, commandKinds, hostCommandKinds } from "../../contracts/commands.ts";
import { hostCommand } from "../../contracts/host.ts";
import { serverKinds } from "../../core/commands/kinds.ts";

/**
 * The host commands' table (contracts/commands.ts) is the one list of kinds: the agent's dispatch
 * (agent/commands/handlers.ts) and the server's table (core/commands/kinds.ts) each cover exactly its kinds, so a
 * kind added to one side only, or left on one side after it left the protocol, fails here (and at compile time).
 */
describe("host command kinds", () => {
  const kinds = [...hostCommandKinds].sort();

  it("the agent handles exactly the protocol's kinds", () => {
    expect(Object.keys(handlers).sort()).toEqual(kinds);
  });

  it("the server settles exactly the protocol's kinds", () => {
    expect(Object.keys(serverKinds).sort()).toEqual(kinds);
  });

  it("the protocol's command schema takes exactly the table's kinds, each with its own arguments", () => {
    const deadline = new Date(Date.now() + 60_000).toISOString();
    const instanceId = `inst_${"a".repeat(52)}`;
    const args = { instanceId, snapshotId: "snap_a", command: ["true"], timeoutMs: 1000 };
    for (const kind of kinds) {
      const parsed = hostCommand.safeParse({ id: "cmd_a", kind, deadline, args });
      expect(parsed.success, kind).toBe(true);
      expect(parsed.data?.args, kind).toEqual(commandKinds[kind].args.parse(args));
    }
    expect(hostCommand.safeParse({ id: "cmd_a", kind: "instance.migrate", deadline, args }).success).toBe(false);
  });

  it("every kind the host does not journal is quick: it may run twice after a restart and is never acknowledged", () => {
    for (const kind of kinds) {
      const k: CommandKind = commandKinds[kind];
      expect(["host", "bulk"], kind).toContain(k.lane);
      if (!k.journalled) expect(k.timeoutMs(k.args.parse({ instanceId: `inst_${"a".repeat(52)}` }), 3_600_000), kind).toBeLessThanOrEqual(60_000);
    }
  });
});
