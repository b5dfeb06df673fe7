import { createHash, randomUUID } from "node:crypto";
import { createWriteStream } from "node:fs";
import { chmod, mkdir, rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import type { InstanceSpec } from "../../../contracts/host.ts";
import { ClassifiedError, Destinations, type SourcePolicy } from "../fetch-guard.ts";
import { PASS_THROUGH_DIR, SHARED_READ_ONLY } from "../files.ts";
import { type FetchOptions, guardedFetch } from "../guarded-fetch.ts";
import { RuntimeError } from "../runtime.ts";
import { run } from "./exec.ts";

/**
 * The host's image cache: a base image is downloaded once under the operator's guard (../guarded-fetch.ts),
 * verified against its sha256 before any use, kept under its digest and shared by every instance made from
 * it. A mismatch discards the file. What a tenant reads of a refusal is a ClassifiedError's short reason.
 */

export interface QemuImgInfo {
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
 * data file would make the host open a path of the image author's choosing. The name goes to the host's log
 * only: for a restored disk it is a path of this host.
 */
export function refuseReferences(info: QemuImgInfo, what: string): void {
  const backing = info["backing-filename"] ?? info["full-backing-filename"];
  if (backing) throw new ClassifiedError(`${what} names a backing file; refused`, false, `backing file ${backing}`);
  const dataFile = info["format-specific"]?.data?.["data-file"];
  if (dataFile) throw new ClassifiedError(`${what} names an external data file; refused`, false, `data file ${dataFile}`);
}

/** How a host fetches images: the operator's allowances (../fetch-guard.ts) and the fetch's bounds. */
export interface ImageSources extends Partial<SourcePolicy>, Pick<FetchOptions, "maxRedirects" | "connectTimeoutMs" | "idleTimeoutMs" | "resolve" | "ca"> {}

/** The host's own trouble keeping a file, which another host may not have. */
const notStored = (e: unknown) =>
  e instanceof RuntimeError ? e : new ClassifiedError("image could not be stored on this host", true, e instanceof Error ? e.message : String(e));

export class ImageCache {
  private readonly inflight = new Map<string, Promise<string>>();
  /**
   * What qemu-img said of each cached file, by path. A file is named by its digest and never rewritten, so the
   * answer holds for as long as the file is there: asking again spawned qemu-img on every create (5–12 ms on
   * a 2-core test machine, a sixth or so of the platform's own time in a create there; bench/libvirt).
   */
  private readonly inspected = new Map<string, QemuImgInfo>();
  private readonly guard: Destinations;

  constructor(
    private readonly dir: string,
    private readonly sources: ImageSources = {},
  ) {
    this.guard = new Destinations({ allow: sources.allow ?? [], allowHttp: sources.allowHttp ?? false });
  }

  /**
   * The verified local copy of the spec's image, its path: no larger than `maxBytes` (the instance's disk),
   * as a file or as the disk it describes. Concurrent asks for one digest and bound share one download.
   */
  get(image: InstanceSpec["image"], maxBytes: number): Promise<string> {
    if (!/^[0-9a-f]{64}$/.test(image.sha256)) return Promise.reject(new ClassifiedError("image digest is not a sha256", false, image.sha256));
    const key = `${image.sha256}/${image.format}/${maxBytes}`;
    let p = this.inflight.get(key);
    if (!p) {
      p = this.fetch(image, maxBytes).finally(() => this.inflight.delete(key));
      this.inflight.set(key, p);
    }
    return p;
  }

  private async fetch(image: InstanceSpec["image"], maxBytes: number): Promise<string> {
    const path = join(this.dir, `${image.sha256}.${image.format}`);
    // A cached copy was verified when it was fetched; an instance with a smaller disk may still not take it.
    const cached = await stat(path).catch(() => null);
    // A file fetched again has the same digest, so the same answer: the entry is replaced, never stale.
    const info = cached ? (this.inspected.get(path) ?? (await inspect(path, image.format))) : await this.download(image, path, maxBytes);
    this.inspected.set(path, info);
    const size = (
      cached ??
      (await stat(path).catch((e: unknown) => {
        throw notStored(e);
      }))
    ).size;
    if (size > maxBytes || info["virtual-size"] > maxBytes) {
      throw new ClassifiedError(
        "image too large for the flavor's disk",
        false,
        `${image.sha256}: ${size} bytes, a disk of ${info["virtual-size"]}; at most ${maxBytes}`,
      );
    }
    return path;
  }

  private async download(image: InstanceSpec["image"], path: string, maxBytes: number): Promise<QemuImgInfo> {
    // QEMU's user reads a base as the backing file of every overlay on it: it must get through to it, and a
    // shared, verified base is readable (an instance's own disk and seed stay private).
    await mkdir(this.dir, { recursive: true })
      .then(() => chmod(this.dir, PASS_THROUGH_DIR))
      .catch((e: unknown) => {
        throw notStored(e);
      });
    const tmp = `${path}.${randomUUID()}.part`;
    try {
      const hash = createHash("sha256");
      const { allow: _a, allowHttp: _h, ...bounds } = this.sources;
      await guardedFetch(image.url, () => createWriteStream(tmp), this.guard, { ...bounds, maxBytes, onChunk: (c) => hash.update(c) }).catch((e: unknown) => {
        throw notStored(e);
      });
      const got = hash.digest("hex");
      if (got !== image.sha256)
        throw new ClassifiedError("image digest mismatch", false, `${image.url} has sha256 ${got}, registered as ${image.sha256}; discarded`);
      const info = await inspect(tmp, image.format);
      refuseReferences(info, "image");
      await chmod(tmp, SHARED_READ_ONLY);
      await rename(tmp, path).catch((e: unknown) => {
        throw notStored(e);
      });
      return info;
    } finally {
      await rm(tmp, { force: true });
    }
  }
}

/** qemu-img's word on an image that was verified: one it cannot read as its registered format is the image's fault. */
async function inspect(path: string, format: InstanceSpec["image"]["format"]): Promise<QemuImgInfo> {
  try {
    return await imageInfo(path, format);
  } catch (e) {
    throw new ClassifiedError(`image is not a readable ${format} image`, false, e instanceof Error ? e.message : String(e));
  }
}
