import { describe, expect, it } from "vitest";
import { ExecOutput } from "../../agent/commands/exec-output.ts";
import type { ExecChunk } from "../../contracts/host.ts";

/** The agent stops sending an exec's output at the cap its command names (the server would drop the rest). */
describe("an exec's output on the agent", () => {
  it("sends at most maxBytes of output, cut between characters, then one note on stderr and nothing more", async () => {
    const batches: ExecChunk[][] = [];
    const out = new ExecOutput({
      attempt: async (chunks) => void batches.push(structuredClone(chunks)),
      backoff: async () => {},
      stop: new AbortController().signal,
      flushMs: 1,
      maxBytes: 10,
    });
    out.push("stdout", "abcd");
    out.push("stderr", "é€"); // 5 bytes: 9 so far
    out.push("stdout", "x😀yz"); // 1 fits, the emoji (4 bytes) does not
    out.push("stdout", "more and more");
    out.push("stderr", "and more");
    await out.end();
    const chunks = batches.flat();
    expect(chunks.map((c) => c.seq)).toEqual(chunks.map((_, i) => i));
    const text = (s: string) =>
      chunks
        .filter((c) => c.stream === s)
        .map((c) => c.data)
        .join("");
    expect(text("stdout")).toBe("abcdx");
    expect(text("stderr")).toBe("é€\n[output truncated: an exec sends at most 10 bytes]\n");
  });

  it("sends everything when no cap is named (an older server's command)", async () => {
    const batches: ExecChunk[][] = [];
    const out = new ExecOutput({ attempt: async (c) => void batches.push(c), backoff: async () => {}, stop: new AbortController().signal, flushMs: 1 });
    out.push("stdout", "y".repeat(100_000));
    await out.end();
    expect(batches.flat().reduce((n, c) => n + c.data.length, 0)).toBe(100_000);
  });
});
