import { Agent as HttpAgent, request as httpRequest } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";

/**
 * A POST and its whole answer, over node:http(s) on kept-alive connections: what `request` uses under Node
 * unless given a fetch. Node's global fetch costs about 0.3–0.5 ms more per request than this on loopback
 * (WHATWG streams and headers around the same socket write), which is most of an idle request's time.
 * Loaded only under Node (client.ts imports it dynamically), so the browser bundle never needs node:http.
 *
 * A kept-alive connection can be closed by the server just as it is reused: Node's agent drops an idle one a
 * second before the time the server announces in its Keep-Alive header (ours: 65 s; Node's default: 5 s), and
 * after a minute at most. A query whose reused connection resets before any answer is sent once more on a fresh
 * one, as Node's documentation advises; a mutation is not, since a server that read it and then died would run
 * it twice.
 */
const IDLE_MS = 60_000;
const agents = { http: new HttpAgent({ keepAlive: true, timeout: IDLE_MS }), https: new HttpsAgent({ keepAlive: true, timeout: IDLE_MS }) };

export function post(
  url: string,
  headers: Record<string, string>,
  body: string,
  signal?: AbortSignal,
  opts: { repeatable?: boolean } = {},
): Promise<{ status: number; text: string }> {
  return once(url, headers, body, signal).catch((e: { code?: string; reused?: boolean }) => {
    if (opts.repeatable && e.reused && e.code === "ECONNRESET" && !signal?.aborted) return once(url, headers, body, signal);
    throw e;
  });
}

function once(url: string, headers: Record<string, string>, body: string, signal?: AbortSignal): Promise<{ status: number; text: string }> {
  const target = new URL(url);
  const https = target.protocol === "https:";
  return new Promise((resolve, reject) => {
    let answered = false;
    const req = (https ? httpsRequest : httpRequest)(
      target,
      { method: "POST", agent: https ? agents.https : agents.http, headers: { ...headers, "content-length": String(Buffer.byteLength(body)) }, signal },
      (res) => {
        answered = true;
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString("utf8") }));
        res.on("error", reject);
      },
    );
    // The agent's idle timeout also reaches a socket in use: a slow answer is the caller's to bound (signal).
    req.on("timeout", () => {});
    req.on("error", (e) => reject(Object.assign(e, { reused: req.reusedSocket && !answered })));
    req.end(body);
  });
}
