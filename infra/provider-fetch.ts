import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";
import { isIP } from "node:net";
import { Readable } from "node:stream";
import { type Address, type Destinations, pinnedLookup, type Resolve, systemResolve } from "../contracts/addresses.ts";

export type { Address, Resolve };

import { ProviderError } from "../core/pools/provider/contract.ts";

/**
 * The fetch provider sessions call their APIs with. An account's endpoint is chosen by an operator's API
 * caller and the call carries the account's credential, so the endpoint follows the image sources' rules
 * (contracts/addresses.ts): https only unless `providers.endpoints.allowHttp`; no loopback, link-local,
 * private or reserved address unless `providers.endpoints.allow` holds it, judged on every address the name
 * resolves to; the connection goes only to the addresses judged (no second lookup a rebinding name server
 * could answer otherwise). Redirects are not followed: an API answers, it does not send a credential on.
 */

const hostOf = (u: URL) => u.hostname.replace(/^\[(.*)\]$/, "$1");

/** Why a URL may not be an account's endpoint, judged without DNS (when the account is made); null if it may. */
export function endpointRefusal(url: string, guard: Destinations): string | null {
  if (!URL.canParse(url)) return "is not a URL";
  const u = new URL(url);
  if (!guard.schemeAllowed(u.protocol)) return u.protocol === "http:" ? "must be https (providers.endpoints.allowHttp allows http)" : "must be an https URL";
  if (u.username || u.password) return "may not carry a user or password";
  const refused = isIP(hostOf(u)) ? guard.refused([hostOf(u)]) : null;
  return refused ? `names a ${refused.category} address (providers.endpoints.allow may allow it)` : null;
}

const refuse = (host: string, why: string) => new ProviderError("invalid", `provider endpoint ${host} refused: ${why}`, { code: "endpoint_refused" });

/** The addresses the URL's host may be reached at, all checked; the hostname itself when it is an address. */
async function destinations(u: URL, guard: Destinations, resolve: Resolve): Promise<Address[]> {
  const host = hostOf(u);
  const why = endpointRefusal(u.href, guard);
  if (why) throw refuse(host, why);
  const literal = isIP(host);
  if (literal) return [{ address: host, family: literal as 4 | 6 }];
  let addresses: Address[];
  try {
    addresses = await resolve(host);
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    throw new ProviderError("transient", `provider endpoint ${host} not resolved (${typeof code === "string" ? code : "error"})`, { code: "dns" });
  }
  if (!addresses.length) throw new ProviderError("transient", `provider endpoint ${host} not resolved (no addresses)`, { code: "dns" });
  const refused = guard.refused(addresses.map((a) => a.address));
  if (refused) throw refuse(host, `it resolves to a ${refused.category} address (providers.endpoints.allow may allow it)`);
  return addresses;
}

function bodyOf(body: RequestInit["body"]): string | Uint8Array | undefined {
  if (body === undefined || body === null) return undefined;
  if (typeof body === "string" || body instanceof Uint8Array) return body;
  if (body instanceof URLSearchParams) return body.toString();
  throw new TypeError("provider fetch sends string, bytes or form bodies only");
}

const NULL_BODY = new Set([101, 103, 204, 205, 304]);

/**
 * A fetch under the guard. Sockets are kept alive in agents of its own, so every pooled socket was connected
 * to an address this guard checked. Failures to connect are a TypeError with the system's error as `cause`,
 * as the global fetch's are; a refused endpoint is a ProviderError (invalid).
 */
export function providerFetch(guard: Destinations, opts: { resolve?: Resolve } = {}): typeof fetch {
  const agents = { "http:": new HttpAgent({ keepAlive: true }), "https:": new HttpsAgent({ keepAlive: true }) };
  return async (input, init = {}) => {
    if (input instanceof Request) throw new TypeError("provider fetch takes a URL and options, not a Request");
    const u = new URL(String(input));
    const addresses = await destinations(u, guard, opts.resolve ?? systemResolve);
    const body = bodyOf(init.body);
    const headers = new Headers(init.headers);
    if (init.body instanceof URLSearchParams && !headers.has("content-type")) headers.set("content-type", "application/x-www-form-urlencoded;charset=UTF-8");
    const method = (init.method ?? "GET").toUpperCase();
    const signal = init.signal ?? undefined;
    signal?.throwIfAborted();
    return new Promise<Response>((resolve, reject) => {
      const req = (u.protocol === "https:" ? httpsRequest : httpRequest)({
        protocol: u.protocol,
        hostname: hostOf(u),
        port: u.port || undefined,
        path: `${u.pathname}${u.search}`,
        method,
        headers: Object.fromEntries(headers),
        agent: agents[u.protocol as "http:" | "https:"],
        lookup: pinnedLookup(addresses),
      });
      let message: IncomingMessage | undefined;
      const abort = () => {
        (message ?? req).destroy(signal?.reason);
        reject(signal?.reason);
      };
      signal?.addEventListener("abort", abort, { once: true });
      const settled = () => signal?.removeEventListener("abort", abort);
      req.on("error", (e) => {
        settled();
        reject(new TypeError("fetch failed", { cause: e }));
      });
      req.once("response", (res) => {
        message = res;
        res.once("close", settled);
        // A failure mid-body reaches the reader through the stream; none may go unheard.
        res.on("error", () => {});
        try {
          const h = new Headers();
          for (let i = 0; i + 1 < res.rawHeaders.length; i += 2) h.append(res.rawHeaders[i] as string, res.rawHeaders[i + 1] as string);
          const empty = NULL_BODY.has(res.statusCode ?? 0) || method === "HEAD";
          if (empty) res.resume();
          resolve(
            new Response(empty ? null : (Readable.toWeb(res) as ReadableStream), {
              status: res.statusCode ?? 0,
              statusText: res.statusMessage ?? "",
              headers: h,
            }),
          );
        } catch (e) {
          res.destroy();
          reject(new TypeError("fetch failed", { cause: e }));
        }
      });
      req.end(body);
    });
  };
}
