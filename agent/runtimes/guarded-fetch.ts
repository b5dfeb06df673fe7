import { type ClientRequest, request as httpRequest, type IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";
import { isIP } from "node:net";
import { Transform, type Writable } from "node:stream";
import { finished, pipeline } from "node:stream/promises";
import { type Address, pinnedLookup, type Resolve, systemResolve } from "../../contracts/addresses.ts";
import { ClassifiedError, type Destinations } from "./fetch-guard.ts";

export type { Address, Resolve };

/**
 * A GET on a tenant's URL under the operator's guard (./fetch-guard.ts): every hop's scheme and every address
 * its name resolves to are checked before connecting, the connection goes to the addresses that were checked
 * (no second lookup a rebinding name server could answer otherwise), redirects are followed by hand and
 * bounded, the body is cut off past a byte cap, and a connection that stalls is dropped. Refusals are
 * ClassifiedErrors: a short reason for the tenant, the particulars for the host's log.
 */

export interface FetchOptions {
  /** The most bytes the body may have: a longer one is refused, from its Content-Length or as it streams. */
  maxBytes: number;
  /** Called with each chunk of the body, in order, before it is written. */
  onChunk?: (chunk: Buffer) => void;
  /** Default 5. */
  maxRedirects?: number;
  /** From the request until the response's headers. Default 15 s. */
  connectTimeoutMs?: number;
  /** The longest the connection may stay silent, once connected. Default 30 s. */
  idleTimeoutMs?: number;
  resolve?: Resolve;
  /** Trust roots for https instead of the system's (Node's NODE_EXTRA_CA_CERTS adds to the system's). */
  ca?: string | Buffer;
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);

/**
 * Stream the body of `url` into the stream `open` makes, under the guard; returns the number of bytes written.
 * `open` is called only once a body is accepted, so a refusal leaves nothing behind it.
 */
export async function guardedFetch(url: string, open: () => Writable, guard: Destinations, o: FetchOptions): Promise<number> {
  const maxRedirects = o.maxRedirects ?? 5;
  let target = parseUrl(url, "image source refused: not a URL");
  for (let hop = 0; ; hop++) {
    const res = await get(target, guard, o);
    if (REDIRECTS.has(res.message.statusCode ?? 0)) {
      res.discard();
      const location = res.message.headers.location;
      if (!location) throw new ClassifiedError(`image source answered HTTP ${res.message.statusCode} without a location`, false, target.href);
      if (hop >= maxRedirects)
        throw new ClassifiedError("image source refused: too many redirects", false, `${maxRedirects} followed, the last to ${target.href}`);
      target = parseUrl(new URL(location, target).href, "image source refused: bad redirect", target.href);
      continue;
    }
    return res.body(open);
  }
}

function parseUrl(href: string, reason: string, from?: string): URL {
  try {
    return new URL(href);
  } catch {
    throw new ClassifiedError(reason, false, from ? `redirect from ${from}` : undefined);
  }
}

/** The addresses of the URL's host, each allowed by the guard; the hostname itself when it is an address. */
async function destinations(target: URL, guard: Destinations, resolve: Resolve): Promise<Address[]> {
  if (!guard.schemeAllowed(target.protocol)) {
    const reason = target.protocol === "http:" ? "image source refused: plain http is not allowed" : "image source refused: unsupported scheme";
    throw new ClassifiedError(reason, false, target.href);
  }
  const host = target.hostname.replace(/^\[(.*)\]$/, "$1");
  let addresses: Address[];
  const literal = isIP(host);
  if (literal) addresses = [{ address: host, family: literal as 4 | 6 }];
  else {
    try {
      addresses = await resolve(host);
    } catch (e) {
      throw new ClassifiedError("image source unreachable: name not resolved", true, `${host}: ${e instanceof Error ? e.message : String(e)}`);
    }
    if (!addresses.length) throw new ClassifiedError("image source unreachable: name not resolved", true, `${host}: no addresses`);
  }
  const refused = guard.refused(addresses.map((a) => a.address));
  if (refused) {
    const all = addresses.map((a) => a.address).join(", ");
    throw new ClassifiedError(
      `image source refused: ${refused.category} destination`,
      false,
      `${target.href} resolves to ${all}; ${refused.address} is ${refused.category}`,
    );
  }
  return addresses;
}

interface Response {
  message: IncomingMessage;
  discard(): void;
  body(open: () => Writable): Promise<number>;
}

/** One hop: a GET to the checked addresses, with its timers; the response once its headers are in. */
async function get(target: URL, guard: Destinations, o: FetchOptions): Promise<Response> {
  const addresses = await destinations(target, guard, o.resolve ?? systemResolve);
  const where = `${target.href} at ${addresses.map((a) => a.address).join(", ")}`;
  // The first refusal wins: destroying a request makes its streams fail with errors of their own.
  let failure: ClassifiedError | undefined;
  const fail = (e: ClassifiedError) => {
    failure ??= e;
    req.destroy(failure);
  };
  const unreachable = (e: unknown) =>
    failure ?? new ClassifiedError(`image source unreachable: ${what(e)}`, true, `${where}: ${e instanceof Error ? e.message : String(e)}`);
  const send = target.protocol === "https:" ? httpsRequest : httpRequest;
  const req: ClientRequest = send({
    protocol: target.protocol,
    hostname: target.hostname.replace(/^\[(.*)\]$/, "$1"),
    port: target.port || undefined,
    path: `${target.pathname}${target.search}`,
    method: "GET",
    headers: { accept: "*/*", "accept-encoding": "identity" },
    // A socket of its own: a pooled one may have been connected by another lookup.
    agent: false,
    lookup: pinnedLookup(addresses),
    ...(o.ca ? { ca: o.ca } : {}),
  });
  const connectTimer = setTimeout(
    () => fail(new ClassifiedError("image source unreachable: timed out", true, `${where}: no response within ${o.connectTimeoutMs ?? 15_000} ms`)),
    o.connectTimeoutMs ?? 15_000,
  );
  req.setTimeout(o.idleTimeoutMs ?? 30_000, () =>
    fail(new ClassifiedError("image source unreachable: stalled", true, `${where}: silent for ${o.idleTimeoutMs ?? 30_000} ms`)),
  );
  req.end();
  let message: IncomingMessage;
  try {
    message = await new Promise<IncomingMessage>((resolve, reject) => {
      req.once("response", resolve);
      req.once("error", reject);
    });
  } catch (e) {
    throw unreachable(e);
  } finally {
    clearTimeout(connectTimer);
  }
  const status = message.statusCode ?? 0;
  const done = () => req.destroy();
  if (!REDIRECTS.has(status) && status !== 200) {
    done();
    throw new ClassifiedError(`image source answered HTTP ${status}`, status >= 500 || status === 408 || status === 429, where);
  }
  return {
    message,
    discard: done,
    body: async (open) => {
      const length = Number(message.headers["content-length"]);
      if (Number.isFinite(length) && length > o.maxBytes) {
        done();
        throw new ClassifiedError("image too large for the flavor's disk", false, `${where}: Content-Length ${length} > ${o.maxBytes}`);
      }
      let bytes = 0;
      const count = new Transform({
        transform(chunk: Buffer, _enc, next) {
          bytes += chunk.length;
          if (bytes > o.maxBytes) return next(new ClassifiedError("image too large for the flavor's disk", false, `${where}: more than ${o.maxBytes} bytes`));
          o.onChunk?.(chunk);
          next(null, chunk);
        },
      });
      const sink = open();
      try {
        await pipeline(message, count, sink);
      } catch (e) {
        // Closed before the caller cleans up after it (a file stream may still be opening).
        await finished(sink).catch(() => {});
        if (failure) throw failure;
        // The sink's own failure (the host's disk) is the host's to tell, not the source's.
        if (e instanceof ClassifiedError || sink.errored) throw e;
        throw unreachable(e);
      } finally {
        done();
      }
      return bytes;
    },
  };
}

/** A network failure as a word a tenant may read. */
function what(e: unknown): string {
  const code = (e as { code?: unknown }).code;
  if (code === "ECONNREFUSED") return "connection refused";
  if (code === "ETIMEDOUT" || code === "ECONNRESET" || code === "EPIPE") return "connection lost";
  if (typeof code === "string" && (code.startsWith("ERR_TLS") || code.startsWith("CERT_") || code.includes("SELF_SIGNED") || code.startsWith("UNABLE_TO")))
    return "TLS failed";
  return "connection failed";
}
