import type { ExecChunk } from "../../contracts/host.ts";

export interface ExecOutputOptions {
  /** One delivery attempt of a batch, bounded in time; resolving means the server has it. */
  attempt(chunks: ExecChunk[]): Promise<void>;
  /** The wait before another attempt, after `failures` failed ones. */
  backoff(failures: number): Promise<void>;
  /** Aborted: deliver nothing more; `end` rejects. */
  stop: AbortSignal;
  onRetry?(err: unknown): void;
  /** How long a piece may wait for others to go with it (default 20 ms). */
  flushMs?: number;
  /** Characters per batch, and so per chunk at most (default 64 Ki). */
  batchChars?: number;
  /** Chunks per batch at most (default 500; the server takes up to 1000 in one call). */
  batchChunks?: number;
  /** Characters held while the server does not take them fast enough; beyond, output is dropped (default 8 Mi). */
  maxPendingChars?: number;
  /** UTF-8 bytes of output sent at most (the server keeps no more): the rest is dropped, with a note on stderr. */
  maxBytes?: number;
}

interface Piece {
  stream: ExecChunk["stream"];
  data: string;
  at: number;
}

/**
 * One exec's output on its way to the server: pieces are batched (what arrives within `flushMs`, up to
 * `batchChars`), numbered in order from seq 0, and each batch is retried until the server has it before the
 * next is sent, so chunks are never reordered and a batch, once numbered, goes again exactly as it was. What
 * is held is bounded: output beyond `maxPendingChars` is dropped and a note on stderr says how much, where.
 * What is sent is bounded too: past `maxBytes` the server would drop it, so it is not sent.
 */
export class ExecOutput {
  private readonly flushMs: number;
  private readonly batchChars: number;
  private readonly batchChunks: number;
  private readonly maxPendingChars: number;
  /** Waiting pieces from `head` on: taken by moving `head`, so a long backlog is not shifted piece by piece. */
  private pending: Piece[] = [];
  private head = 0;
  private pendingChars = 0;
  private dropped = 0;
  /** UTF-8 bytes taken towards `maxBytes`; null once the cap was reached and nothing more is taken. */
  private sentBytes: number | null = 0;
  private seq = 0;
  private ended = false;
  private wake: () => void = () => {};
  private readonly loop: Promise<void>;

  constructor(private readonly o: ExecOutputOptions) {
    this.flushMs = o.flushMs ?? 20;
    this.batchChars = o.batchChars ?? 64 * 1024;
    this.batchChunks = o.batchChunks ?? 500;
    this.maxPendingChars = o.maxPendingChars ?? 8 * 1024 * 1024;
    // The stop signal is the agent's, which outlives every exec: the listener goes when the loop does.
    const onStop = () => this.wake();
    o.stop.addEventListener("abort", onStop, { once: true });
    this.loop = this.run().finally(() => o.stop.removeEventListener("abort", onStop));
    // `end` reports how the loop ended; nobody may be listening when it is stopped.
    this.loop.catch(() => {});
  }

  push(stream: ExecChunk["stream"], data: string): void {
    if (this.ended || this.o.stop.aborted || data.length === 0 || this.sentBytes === null) return;
    let piece = data;
    let capped = false;
    if (this.o.maxBytes !== undefined) {
      const bytes = Buffer.byteLength(data);
      capped = this.sentBytes + bytes > this.o.maxBytes;
      if (capped) piece = utf8Prefix(data, this.o.maxBytes - this.sentBytes);
      this.sentBytes = capped ? null : this.sentBytes + bytes;
    }
    if (this.pendingChars + piece.length > this.maxPendingChars) this.dropped += piece.length;
    else if (piece.length > 0) {
      if (this.dropped > 0) this.noteDropped();
      this.split(stream, piece);
    }
    if (!capped) return;
    if (this.dropped > 0) this.noteDropped();
    this.split("stderr", `\n[output truncated: an exec sends at most ${this.o.maxBytes} bytes]\n`);
  }

  /** No more output: resolves once every chunk is delivered; rejects if stopped first. */
  end(): Promise<void> {
    if (!this.ended && this.dropped > 0) this.noteDropped();
    this.ended = true;
    this.wake();
    return this.loop;
  }

  private split(stream: ExecChunk["stream"], data: string): void {
    for (let i = 0; i < data.length; ) {
      let end = Math.min(data.length, i + this.batchChars);
      // Never between the halves of a surrogate pair: each chunk must be valid UTF-16 on its own.
      if (end < data.length && end - 1 > i && isHighSurrogate(data.charCodeAt(end - 1))) end--;
      this.add(stream, data.slice(i, end));
      i = end;
    }
  }

  private add(stream: ExecChunk["stream"], data: string): void {
    const last = this.pending.length > this.head ? this.pending.at(-1) : undefined;
    // Joined while waiting: output written a byte at a time stays a few pieces, not millions.
    if (last && last.stream === stream && last.data.length + data.length <= this.batchChars) last.data += data;
    else this.pending.push({ stream, data, at: Date.now() });
    this.pendingChars += data.length;
    if (this.pending.length - this.head === 1 || this.pendingChars >= this.batchChars) this.wake();
  }

  private noteDropped(): void {
    const note = `\n[${this.dropped} characters of output dropped here: they came faster than the server took them]\n`;
    this.dropped = 0;
    // Past the bound by the note's length at most: where the gap is must be said.
    this.split("stderr", note);
  }

  private async run(): Promise<void> {
    for (;;) {
      if (this.o.stop.aborted) throw new Error("output delivery stopped");
      const woken = new Promise<void>((r) => (this.wake = r));
      const first = this.pending[this.head];
      if (!first) {
        if (this.ended) return;
        await woken;
        continue;
      }
      const wait = first.at + this.flushMs - Date.now();
      if (!this.ended && this.pendingChars < this.batchChars && wait > 0) {
        await Promise.race([woken, new Promise((r) => setTimeout(r, wait))]);
        continue;
      }
      await this.deliver(this.take());
    }
  }

  private take(): ExecChunk[] {
    const chunks: ExecChunk[] = [];
    let size = 0;
    for (let p = this.pending[this.head]; p && (size === 0 || size + p.data.length <= this.batchChars); p = this.pending[this.head]) {
      const last = chunks.at(-1);
      if (last && last.stream === p.stream) last.data += p.data;
      else if (chunks.length < this.batchChunks) chunks.push({ seq: this.seq++, stream: p.stream, data: p.data });
      else break;
      this.head++;
      size += p.data.length;
      p.data = ""; // what was sent is not held until the array is compacted
    }
    this.pendingChars -= size;
    if (this.head === this.pending.length || (this.head > 1024 && this.head * 2 > this.pending.length)) {
      this.pending = this.pending.slice(this.head);
      this.head = 0;
    }
    return chunks;
  }

  private async deliver(chunks: ExecChunk[]): Promise<void> {
    for (let failures = 0; ; ) {
      try {
        return await this.o.attempt(chunks);
      } catch (e) {
        if (this.o.stop.aborted) throw e;
        this.o.onRetry?.(e);
        await this.o.backoff(failures++);
      }
    }
  }
}

const isHighSurrogate = (c: number) => c >= 0xd800 && c <= 0xdbff;

/** The longest prefix of `s` of at most `max` UTF-8 bytes, never between the halves of a character. */
function utf8Prefix(s: string, max: number): string {
  let end = 0;
  for (const ch of s) {
    max -= Buffer.byteLength(ch);
    if (max < 0) break;
    end += ch.length;
  }
  return s.slice(0, end);
}
