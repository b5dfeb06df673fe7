import { execFile } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer as createHttpServer, type RequestListener, type Server } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ClassifiedError, Destinations } from "../../agent/runtimes/fetch-guard.ts";
import { guardedFetch, type Resolve } from "../../agent/runtimes/guarded-fetch.ts";
import { ImageCache, type ImageSources } from "../../agent/runtimes/libvirt-kvm/images.ts";
import { RuntimeError } from "../../agent/runtimes/runtime.ts";

/**
 * The host's image download against real HTTP(S) servers on loopback: the operator's allowance lets it
 * through; without it nothing is fetched, and no connection is even opened. What the tenant reads is a
 * classified reason with nothing of the host in it.
 */

const run = promisify(execFile);
const root = mkdtempSync(join(tmpdir(), "bc-image-fetch-"));
const sha256 = (b: Buffer) => createHash("sha256").update(b).digest("hex");
const MiB = 2 ** 20;

// A raw image of 256 KiB, a qcow2 whose disk (64 MiB) is far larger than its file, and bytes nobody registered.
const raw = randomBytes(256 * 1024);
let qcow2: Buffer;
const secret = Buffer.from("aws_secret_access_key=SECRET-OF-THE-HOST\n");

interface Served {
  server: Server;
  port: number;
  /** Connections the server accepted since it started. */
  connections: () => number;
}

async function serve(handler: RequestListener, tls?: { key: string; cert: string }): Promise<Served> {
  const server = tls ? createHttpsServer(tls, handler) : createHttpServer(handler);
  let connections = 0;
  server.on(tls ? "secureConnection" : "connection", () => connections++);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { server, port: (server.address() as AddressInfo).port, connections: () => connections };
}

let http: Served;
const url = (path: string, host = "127.0.0.1") => `http://${host}:${http.port}${path}`;

const routes: Record<string, RequestListener> = {
  "/raw.img": (_q, res) => void res.writeHead(200, { "content-length": raw.length }).end(raw),
  "/disk.qcow2": (_q, res) => void res.writeHead(200, { "content-length": qcow2.length }).end(qcow2),
  "/secret": (_q, res) => void res.writeHead(200).end(secret),
  "/redirect/raw": (_q, res) => void res.writeHead(302, { location: "/raw.img" }).end(),
  "/redirect/metadata": (_q, res) => void res.writeHead(302, { location: "http://169.254.169.254/latest/meta-data/iam/" }).end(),
  "/redirect/file": (_q, res) => void res.writeHead(301, { location: "file:///etc/shadow" }).end(),
  "/redirect/loop": (_q, res) => void res.writeHead(307, { location: "/redirect/loop" }).end(),
  "/big/declared": (_q, res) => void res.writeHead(200, { "content-length": 4 * MiB }).end(Buffer.alloc(4 * MiB)),
  "/big/chunked": (_q, res) => {
    // No length up front: the cap must hold while the body streams.
    res.writeHead(200);
    let sent = 0;
    const more = () => {
      while (sent < 8 * MiB && !res.destroyed) {
        sent += 64 * 1024;
        if (!res.write(Buffer.alloc(64 * 1024))) return void res.once("drain", more);
      }
      res.end();
    };
    more();
  },
  "/stall": (_q, res) => {
    res.writeHead(200, { "content-length": raw.length });
    res.write(raw.subarray(0, 1024)); // and then nothing
  },
  "/missing": (_q, res) => void res.writeHead(404).end("no such image at /srv/images on mirror-7"),
  "/busy": (_q, res) => void res.writeHead(503).end(),
};

beforeAll(async () => {
  const file = join(root, "disk.qcow2");
  await run("qemu-img", ["create", "-q", "-f", "qcow2", file, "64M"]);
  qcow2 = readFileSync(file);
  http = await serve((req, res) => (routes[req.url ?? ""] ?? ((_q, r) => void r.writeHead(404).end()))(req, res));
});
afterAll(async () => {
  await new Promise((r) => http?.server.close(r));
  rmSync(root, { recursive: true, force: true });
});

const LOOPBACK: ImageSources = { allow: ["127.0.0.0/8", "::1"], allowHttp: true };
let caches = 0;
/** A fresh host cache with these sources, and the files in its folder. */
function cache(sources: ImageSources) {
  const dir = join(root, `cache-${++caches}`);
  return { cache: new ImageCache(dir, sources), files: () => readdirSync(dir) };
}
const rawImage = (u: string) => ({ url: u, sha256: sha256(raw), format: "raw" as const });

/** The refusal `p` ends with; fails when it succeeds. */
async function refusal(p: Promise<unknown>): Promise<ClassifiedError> {
  const e = await p.then(
    () => {
      throw new Error("expected a refusal, but it succeeded");
    },
    (e: unknown) => e,
  );
  expect(e).toBeInstanceOf(ClassifiedError);
  expect(e).toBeInstanceOf(RuntimeError);
  return e as ClassifiedError;
}

// Everything a tenant may read: fixed reasons, nothing of the host, the source's answer or the addresses.
const CLASSIFIED =
  /^image (source refused: [a-z -]+|source unreachable: [a-zA-Z ]+|source answered HTTP \d{3}( without a location)?|too large for the flavor's disk|digest mismatch|is not a readable [a-z0-9]+ image|names a backing file; refused|could not be stored on this host)$/;
function tellsNothing(e: ClassifiedError) {
  expect(e.message).toMatch(CLASSIFIED);
  for (const internal of [root, "127.0.0.1", "169.254", String(http.port), "SECRET", sha256(secret), "mirror-7", "/srv"])
    expect(e.message).not.toContain(internal);
}

describe("image downloads with the operator's loopback allowance", () => {
  it("downloads and verifies an image, keeps it under its digest and serves the next ask from the cache", async () => {
    const { cache: c, files } = cache(LOOPBACK);
    const before = http.connections();
    const path = await c.get(rawImage(url("/raw.img")), MiB);
    expect(sha256(readFileSync(path))).toBe(sha256(raw));
    expect(files()).toEqual([`${sha256(raw)}.raw`]);
    expect(http.connections()).toBe(before + 1);
    expect(await c.get(rawImage(url("/raw.img")), MiB)).toBe(path);
    expect(http.connections()).toBe(before + 1);
  });

  it("follows a redirect within the allowance, and resolves a name to an allowed address", async () => {
    const { cache: c } = cache(LOOPBACK);
    expect(sha256(readFileSync(await c.get(rawImage(url("/redirect/raw")), MiB)))).toBe(sha256(raw));
    const { cache: byName } = cache(LOOPBACK);
    expect(sha256(readFileSync(await byName.get(rawImage(url("/raw.img", "localhost")), MiB)))).toBe(sha256(raw));
  });

  it("refuses a redirect from an allowed host to the metadata endpoint, another scheme, or round in circles", async () => {
    const { cache: c, files } = cache(LOOPBACK);
    const metadata = await refusal(c.get(rawImage(url("/redirect/metadata")), MiB));
    expect(metadata.message).toBe("image source refused: link-local destination");
    expect(metadata.retryable).toBe(false);
    // The host's log has what was refused.
    expect(String(metadata)).toContain("169.254.169.254");
    tellsNothing(metadata);
    expect((await refusal(c.get(rawImage(url("/redirect/file")), MiB))).message).toBe("image source refused: unsupported scheme");
    const loop = await refusal(c.get(rawImage(url("/redirect/loop")), MiB));
    expect(loop.message).toBe("image source refused: too many redirects");
    tellsNothing(loop);
    expect(files()).toEqual([]);
  });

  it("refuses a body larger than the instance's disk, declared or streamed, and keeps nothing of it", async () => {
    const { cache: c, files } = cache(LOOPBACK);
    for (const path of ["/big/declared", "/big/chunked"]) {
      const e = await refusal(c.get({ url: url(path), sha256: sha256(raw), format: "raw" }, MiB));
      expect(e.message).toBe("image too large for the flavor's disk");
      expect(e.retryable).toBe(false);
      tellsNothing(e);
    }
    expect(files()).toEqual([]);
  });

  it("refuses an image whose disk is larger than the instance's, fetched or already cached", async () => {
    const { cache: c, files } = cache(LOOPBACK);
    const image = { url: url("/disk.qcow2"), sha256: sha256(qcow2), format: "qcow2" as const };
    // Its file is small; the disk it describes is 64 MiB.
    expect(qcow2.length).toBeLessThan(MiB);
    expect((await refusal(c.get(image, 32 * MiB))).message).toBe("image too large for the flavor's disk");
    await c.get(image, 64 * MiB);
    expect(files()).toEqual([`${sha256(qcow2)}.qcow2`]);
    expect((await refusal(c.get(image, 32 * MiB))).message).toBe("image too large for the flavor's disk");
  });

  it("asks qemu-img of a cached image once, and again when its file has gone and comes back", async () => {
    // qemu-img behind a shim on PATH that counts its runs: the answer must come from the real tool each time it is asked.
    const shim = join(root, "shim");
    const count = join(root, "qemu-img-runs");
    mkdirSync(shim, { recursive: true });
    writeFileSync(count, "");
    const real = (await run("sh", ["-c", "command -v qemu-img"])).stdout.trim();
    writeFileSync(join(shim, "qemu-img"), `#!/bin/sh\necho "$1" >> '${count}'\nexec '${real}' "$@"\n`, { mode: 0o755 });
    const runs = () => (readFileSync(count, "utf8").match(/^info$/gm) ?? []).length;
    const path = process.env.PATH;
    process.env.PATH = `${shim}:${path}`;
    try {
      const { cache: c } = cache(LOOPBACK);
      const image = { url: url("/disk.qcow2"), sha256: sha256(qcow2), format: "qcow2" as const };
      const before = http.connections();
      const file = await c.get(image, 64 * MiB);
      expect(runs()).toBe(1);
      expect(await c.get(image, 64 * MiB)).toBe(file);
      // What it said still bounds the disk: the next instance with a smaller one is refused, without asking again.
      expect((await refusal(c.get(image, 32 * MiB))).message).toBe("image too large for the flavor's disk");
      expect(runs()).toBe(1);
      // Gone (an operator cleared the cache): fetched, verified and inspected afresh.
      rmSync(file);
      expect(await c.get(image, 64 * MiB)).toBe(file);
      expect(http.connections()).toBe(before + 2);
      expect(runs()).toBe(2);
      // A new cache on the same folder (the agent restarted) asks once of the file it finds.
      const again = new ImageCache(join(file, ".."), LOOPBACK);
      expect(await again.get(image, 64 * MiB)).toBe(file);
      expect(await again.get(image, 64 * MiB)).toBe(file);
      expect(runs()).toBe(3);
      expect(http.connections()).toBe(before + 2);
    } finally {
      process.env.PATH = path;
    }
  });

  it("says a digest mismatch without saying what the source answered", async () => {
    const { cache: c, files } = cache(LOOPBACK);
    const e = await refusal(c.get(rawImage(url("/secret")), MiB));
    expect(e.message).toBe("image digest mismatch");
    expect(e.retryable).toBe(false);
    tellsNothing(e);
    expect(files()).toEqual([]);
  });

  it("classifies what the source answered and what the network did, retryable where another try may do", async () => {
    const { cache: c } = cache(LOOPBACK);
    const missing = await refusal(c.get(rawImage(url("/missing")), MiB));
    expect([missing.message, missing.retryable]).toEqual(["image source answered HTTP 404", false]);
    tellsNothing(missing);
    const busy = await refusal(c.get(rawImage(url("/busy")), MiB));
    expect([busy.message, busy.retryable]).toEqual(["image source answered HTTP 503", true]);
    const closed = await serve(() => {});
    await new Promise((r) => closed.server.close(r));
    const refused = await refusal(c.get(rawImage(`http://127.0.0.1:${closed.port}/raw.img`), MiB));
    expect([refused.message, refused.retryable]).toEqual(["image source unreachable: connection refused", true]);
    tellsNothing(refused);
    // The host's own trouble: its cache cannot be made (a file is in the way). Another host may do.
    writeFileSync(join(root, "in-the-way"), "");
    const unstorable = await refusal(new ImageCache(join(root, "in-the-way", "images"), LOOPBACK).get(rawImage(url("/raw.img")), MiB));
    expect([unstorable.message, unstorable.retryable]).toEqual(["image could not be stored on this host", true]);
    tellsNothing(unstorable);
    const { cache: impatient, files } = cache({ ...LOOPBACK, idleTimeoutMs: 200 });
    const stalled = await refusal(impatient.get(rawImage(url("/stall")), MiB));
    expect([stalled.message, stalled.retryable]).toEqual(["image source unreachable: stalled", true]);
    expect(files()).toEqual([]);
  });
});

describe("image downloads without the allowance", () => {
  it("refuses loopback, by address or by name, and never connects", async () => {
    const { cache: c, files } = cache({ allowHttp: true });
    const before = http.connections();
    for (const u of [url("/raw.img"), url("/raw.img", "localhost"), url("/raw.img", "[::ffff:127.0.0.1]"), url("/raw.img", "2130706433")]) {
      const e = await refusal(c.get(rawImage(u), MiB));
      expect(e.message).toBe("image source refused: loopback destination");
      expect(e.retryable).toBe(false);
      tellsNothing(e);
    }
    expect(http.connections()).toBe(before);
    expect(files()).toEqual([]);
  });

  it("refuses plain http unless the operator allows it, before resolving or connecting", async () => {
    const { cache: c } = cache({ allow: ["127.0.0.0/8"] });
    const before = http.connections();
    const e = await refusal(c.get(rawImage(url("/raw.img")), MiB));
    expect(e.message).toBe("image source refused: plain http is not allowed");
    expect(http.connections()).toBe(before);
  });
});

describe("the guarded fetch", () => {
  const sink = () => () =>
    new Writable({
      write(_c, _e, done) {
        done();
      },
    });

  it("connects to the address it checked: a name the system cannot resolve reaches the server through the one lookup", async () => {
    const asked: string[] = [];
    const resolve: Resolve = async (host) => {
      asked.push(host);
      return [{ address: "127.0.0.1", family: 4 }];
    };
    const loopback = new Destinations({ allow: ["127.0.0.0/8"], allowHttp: true });
    const n = await guardedFetch(`http://mirror.invalid:${http.port}/redirect/raw`, sink(), loopback, { maxBytes: MiB, resolve });
    expect(n).toBe(raw.length);
    // Once per hop, and nothing else was asked: `.invalid` never resolves on a real name server.
    expect(asked).toEqual(["mirror.invalid", "mirror.invalid"]);
  });

  it("refuses a name when any of its addresses is refused", async () => {
    const resolve: Resolve = async () => [
      { address: "93.184.216.34", family: 4 },
      { address: "10.0.0.7", family: 4 },
    ];
    const e = await refusal(guardedFetch("https://mixed.invalid/i.raw", sink(), new Destinations(), { maxBytes: MiB, resolve }));
    expect(e.message).toBe("image source refused: private destination");
    expect(String(e)).toContain("10.0.0.7");
    tellsNothing(e);
  });

  it("speaks https to a pinned address, checking the certificate against the URL's name", async () => {
    const key = join(root, "tls.key");
    const cert = join(root, "tls.crt");
    await run("openssl", [
      ...["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"],
      ...["-addext", "subjectAltName=DNS:localhost", "-keyout", key, "-out", cert],
    ]);
    const tls = { key: readFileSync(key, "utf8"), cert: readFileSync(cert, "utf8") };
    const https = await serve((_q, res) => void res.writeHead(200, { "content-length": raw.length }).end(raw), tls);
    try {
      const loopback = new Destinations({ allow: ["127.0.0.0/8", "::1"], allowHttp: false });
      expect(await guardedFetch(`https://localhost:${https.port}/raw.img`, sink(), loopback, { maxBytes: MiB, ca: tls.cert })).toBe(raw.length);
      // The certificate names localhost, not the address: asked by address, the same server is not trusted.
      const byAddress = await refusal(guardedFetch(`https://127.0.0.1:${https.port}/raw.img`, sink(), loopback, { maxBytes: MiB, ca: tls.cert }));
      expect([byAddress.message, byAddress.retryable]).toEqual(["image source unreachable: TLS failed", true]);
      const untrusted = await refusal(guardedFetch(`https://localhost:${https.port}/raw.img`, sink(), loopback, { maxBytes: MiB }));
      expect(untrusted.message).toBe("image source unreachable: TLS failed");
      const before = https.connections();
      const refused = await refusal(guardedFetch(`https://localhost:${https.port}/raw.img`, sink(), new Destinations(), { maxBytes: MiB, ca: tls.cert }));
      expect(refused.message).toBe("image source refused: loopback destination");
      expect(https.connections()).toBe(before);
    } finally {
      await new Promise((r) => https.server.close(r));
    }
  });
});
