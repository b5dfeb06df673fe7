import { createHash } from "node:crypto";
import { createWriteStream } from "node:fs";
import { mkdir, rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { InstanceSpec } from "../../../contracts/host.ts";
import { RuntimeError } from "../runtime.ts";
import { run } from "./exec.ts";

/**
 * The host's image cache: a base image is downloaded once, verified against its sha256 before any use, kept
 * under its digest and shared by every instance made from it. A mismatch discards the file.
 */

interface QemuImgInfo {
  format: string;
  "virtual-size": number;
  "backing-filename"?: string;
  "full-backing-filename"?: string;
  "format-specific"?: { type?: string; data?: { "data-file"?: string } };
}

/**
 * Inspect an image as the format it was registered with, without following anything it names: a qcow2 is
 * opened with `backing: null`, so its header is read but no backing file is ever opened on the host. `-U`
 * (force-share): the disk of a running domain is locked by its QEMU, and reading its header is still safe.
 */
export async function imageInfo(path: string, format: "raw" | "qcow2" | "iso"): Promise<QemuImgInfo> {
  const target = format === "qcow2" ? `json:${JSON.stringify({ driver: "qcow2", backing: null, file: { driver: "file", filename: path } })}` : path;
  const args = ["info", "-U", "--output=json", ...(format === "qcow2" ? [] : ["-f", "raw"]), target];
  return JSON.parse(await run("qemu-img", args)) as QemuImgInfo;
}

/**
 * A tenant's image (or a restored disk) must stand alone: a qcow2 that names a backing file or an external
 * data file would make the host open a path of the image author's choosing.
 */
export function refuseReferences(info: QemuImgInfo, what: string): void {
  if (info["backing-filename"] || info["full-backing-filename"]) {
    throw new RuntimeError(`${what} names a backing file (${info["backing-filename"] ?? info["full-backing-filename"]}); refused`, false);
  }
  const dataFile = info["format-specific"]?.data?.["data-file"];
  if (dataFile) throw new RuntimeError(`${what} names an external data file (${dataFile}); refused`, false);
}

export class ImageCache {
  private readonly inflight = new Map<string, Promise<string>>();

  constructor(private readonly dir: string) {}

  /** The verified local copy of the spec's image: its path. Concurrent asks for one digest share one download. */
  get(image: InstanceSpec["image"]): Promise<string> {
    if (!/^[0-9a-f]{64}$/.test(image.sha256)) return Promise.reject(new RuntimeError(`image digest ${image.sha256} is not a sha256`, false));
    let p = this.inflight.get(image.sha256);
    if (!p) {
      p = this.fetch(image).finally(() => this.inflight.delete(image.sha256));
      this.inflight.set(image.sha256, p);
    }
    return p;
  }

  private async fetch(image: InstanceSpec["image"]): Promise<string> {
    const path = join(this.dir, `${image.sha256}.${image.format}`);
    if (await exists(path)) return path;
    await mkdir(this.dir, { recursive: true });
    const tmp = `${path}.${process.pid}.${Date.now()}.part`;
    try {
      const res = await fetch(image.url).catch((e: unknown) => {
        throw new RuntimeError(`image ${image.url} could not be fetched: ${e instanceof Error ? e.message : String(e)}`, true);
      });
      if (!res.ok || !res.body) throw new RuntimeError(`image ${image.url} could not be fetched: HTTP ${res.status}`, res.status >= 500);
      const hash = createHash("sha256");
      const tap = new Transform({
        transform(chunk: Buffer, _enc, done) {
          hash.update(chunk);
          done(null, chunk);
        },
      });
      await pipeline(Readable.fromWeb(res.body as never), tap, createWriteStream(tmp));
      const got = hash.digest("hex");
      if (got !== image.sha256) throw new RuntimeError(`image ${image.url} has sha256 ${got}, not the registered ${image.sha256}; discarded`, false);
      refuseReferences(await imageInfo(tmp, image.format), `image ${image.url}`);
      await rename(tmp, path);
      return path;
    } finally {
      await rm(tmp, { force: true });
    }
  }
}

async function exists(p: string): Promise<boolean> {
  try {
    await stat(p);
    return true;
  } catch {
    return false;
  }
}
