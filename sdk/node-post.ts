import { Agent as HttpAgent, request as httpRequest } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";

/**
 * A POST and its whole answer, over node:http(s) on kept-alive connections: what `request` uses under Node
 * unless given a fetch. Node's global fetch costs about 0.3–0.5 ms more per request than this on loopback
 * (WHATWG streams and headers around the same socket write), which is most of an idle request's time.
 * Loaded only under Node (client.ts imports it dynamically), so the browser bundle never needs node:http.
 */
const agents = { http: new HttpAgent({ keepAlive: true }), https: new HttpsAgent({ keepAlive: true }) };

export function post(url: string, headers: Record<string, string>, body: string, signal?: AbortSignal): Promise<{ status: number; text: string }> {
  const target = new URL(url);
  const https = target.protocol === "https:";
  return new Promise((resolve, reject) => {
    const req = (https ? httpsRequest : httpRequest)(
      target,
      { method: "POST", agent: https ? agents.https : agents.http, headers: { ...headers, "content-length": String(Buffer.byteLength(body)) }, signal },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString("utf8") }));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}
