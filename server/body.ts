import type { IncomingMessage, ServerResponse } from "node:http";

/**
 * Whether a request's body may go on to yoga: it must declare its length (`content-length`), and that length
 * must be within `limits.bodyBytes`. Node's parser reads exactly the declared length as the body, so nothing
 * past the limit is ever read. A chunked body is refused (411) rather than counted as it arrives: clients of
 * this API (the SDK, browsers, curl) declare the length of what they send.
 *
 * Yoga can bound a body itself, but does it by piping every request through a web TransformStream (an abort
 * controller, a stream pipeline, an exception object made as each request ends), which cost half of an idle
 * request's CPU on this server; it is switched off (`maxRequestBodySize: false`) and this takes its place.
 */
export function bodyAllowed(req: IncomingMessage, res: ServerResponse, limit: number): boolean {
  const declared = req.headers["content-length"];
  // Node's parser has already refused a content-length that is not one decimal number, or one sent twice.
  if (declared !== undefined)
    return (
      Number(declared) <= limit ||
      refuse(res, 413, { message: `the request body is larger than ${limit} bytes (the server's limits.bodyBytes)`, limit: "bodyBytes" })
    );
  if (req.headers["transfer-encoding"] === undefined) return true;
  return refuse(res, 411, { message: "send the request body with a content-length" });
}

function refuse(res: ServerResponse, status: 411 | 413, { message, ...extensions }: { message: string; limit?: string }): false {
  const error = { message, extensions: { code: "INVALID_INPUT", ...extensions } };
  // The body is left unread: the connection is closed after the answer rather than drained.
  res.writeHead(status, { "content-type": "application/json; charset=utf-8", connection: "close" }).end(`${JSON.stringify({ errors: [error] })}\n`);
  return false;
}
