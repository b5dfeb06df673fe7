import { mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { RefusalCode } from "../../contracts/commands.ts";
import type { CommandReport, HostCommand } from "../../contracts/host.ts";
import { PRIVATE_DIR, PRIVATE_FILE } from "../runtimes/files.ts";
import type { DomainStatus } from "../runtimes/runtime.ts";

/** What the host remembers of a command, so a command delivered again (after any restart) runs once. */
export interface CommandJournal {
  command: HostCommand;
  state: CommandReport["state"];
  result: Record<string, unknown> | null;
  error: string | null;
  /** failed: why, in the protocol's vocabulary (absent from journals written before codes). */
  code?: RefusalCode;
  /** The server has the final report. */
  confirmed: boolean;
  startedAt: string;
  finishedAt: string | null;
  /**
   * The domain as it was when the command first began (a snapshot or a restore): what reports show while the
   * command holds it, also after a crash, when the domain may be halfway through the command (a save leaves it off).
   */
  pinned?: DomainStatus;
}

/** The journals in one directory, a file per command. */
export class CommandJournals {
  constructor(readonly dir: string) {}

  path(id: string): string {
    // Ids are validated by the schema (cmd_[a-z2-7]+), so they are safe file names.
    return join(this.dir, `${id}.json`);
  }

  async read(id: string): Promise<CommandJournal | null> {
    try {
      return JSON.parse(await readFile(this.path(id), "utf8")) as CommandJournal;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw e;
    }
  }

  async all(): Promise<CommandJournal[]> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    const out: CommandJournal[] = [];
    for (const n of names) {
      if (!/^cmd_[a-z2-7]+\.json$/.test(n)) continue;
      const j = await this.read(n.slice(0, -5));
      if (j) out.push(j);
    }
    return out;
  }

  /** Aside and renamed: a journal is the old one or the new one, never half of either. */
  async write(j: CommandJournal): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: PRIVATE_DIR });
    const file = this.path(j.command.id);
    await writeFile(`${file}.tmp`, `${JSON.stringify(j, null, 2)}\n`, { mode: PRIVATE_FILE });
    await rename(`${file}.tmp`, file);
  }

  async remove(id: string): Promise<void> {
    await rm(this.path(id), { force: true });
  }
}
