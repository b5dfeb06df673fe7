import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream, existsSync, readFileSync } from "node:fs";
import { chmod } from "node:fs/promises";
import { createServer } from "node:http";
import { dirname } from "node:path";
import { promisify } from "node:util";
import { openLibvirt } from "../../agent/runtimes/libvirt-kvm/index.ts";
import type { InstanceSpec } from "../../contracts/host.ts";

/** Helpers of the real-hypervisor suite: host tools, a loopback image server, a bridge of the test's own. */

const exec = promisify(execFile);

export async function sh(cmd: string, args: string[]): Promise<string> {
  return (await exec(cmd, args, { maxBuffer: 64 * 2 ** 20 })).stdout;
}

export const virsh = (...args: string[]) => sh("virsh", ["-c", "qemu:///system", ...args]);

/**
 * The suite needs a real libvirtd and QEMU: without them it fails, loudly, naming what is missing (npm test
 * installs and starts them). It never skips.
 */
export async function requireHypervisor(): Promise<void> {
  for (const tool of ["virsh", "qemu-img", "genisoimage", "debugfs", "ip"]) {
    await sh("sh", ["-c", `command -v ${tool}`]).catch(() => {
      throw new Error(`tests/kvm needs ${tool} on this machine (npm test installs it: scripts/test-setup.sh)`);
    });
  }
  await virsh("version").catch((e: Error) => {
    throw new Error(`tests/kvm needs a running libvirtd reachable at qemu:///system (npm test starts it: scripts/test-setup.sh): ${e.message}`);
  });
  const hv = await openLibvirt().catch((e: Error) => {
    throw new Error(`tests/kvm needs the @unraid/libvirt binding built (npm ci with libvirt-dev installed): ${e.message}`);
  });
  await hv.connectClose();
}

/**
 * What an operator allows to let hosts fetch from this suite's image server: loopback, over plain http. For a
 * runtime made in the test, and as `bc agent` flags. Without them a host refuses the server (see tests/unit/image-fetch.test.ts).
 */
export const loopbackSources = { allow: ["127.0.0.0/8"], allowHttp: true };
export const loopbackSourceFlags = ["--image-source-allow", "127.0.0.0/8", "--image-source-http"];

/** Serve files on loopback by name: the host downloads base images from here, as from any image server. */
export async function serveFiles(files: Record<string, string>): Promise<{ url: (name: string) => string; close: () => Promise<void> }> {
  const server = createServer((req, res) => {
    const path = files[(req.url ?? "/").slice(1)];
    if (!path || !existsSync(path)) return void res.writeHead(404).end();
    res.writeHead(200, { "content-type": "application/octet-stream" });
    createReadStream(path).pipe(res);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  return { url: (name) => `http://127.0.0.1:${port}/${name}`, close: () => new Promise((r) => server.close(() => r())) };
}

/** A bridge with no uplink, no forwarding and no address: guests' NICs join it and go nowhere. */
export async function makeBridge(name: string): Promise<{ name: string; members: () => Promise<string[]>; remove: () => Promise<void> }> {
  await sh("ip", ["link", "add", name, "type", "bridge"]);
  await sh("ip", ["link", "set", name, "up"]);
  return {
    name,
    members: async () => (await sh("ip", ["-o", "link", "show", "master", name])).split("\n").filter(Boolean),
    remove: async () => void (await sh("ip", ["link", "del", name]).catch(() => "")),
  };
}

/** QEMU runs as its own user: every directory above its files must let it through. */
export async function openPath(path: string): Promise<void> {
  for (let p = path; p !== dirname(p); p = dirname(p)) await chmod(p, 0o755).catch(() => {});
}

/** The guest's own words on its serial console, as `BC-GUEST key=value` pairs. */
export function guestSaid(consolePath: string): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  if (!existsSync(consolePath)) return out;
  for (const m of readFileSync(consolePath, "utf8").matchAll(/BC-GUEST ([a-z0-9-]+)(?:=(\S*))?/g)) {
    const key = m[1] as string;
    out[key] = [...(out[key] ?? []), m[2] ?? ""];
  }
  return out;
}

/**
 * The guest's in-memory counter as printed on its console from byte `from` of the log on (the log is appended
 * across boots and restores). Only whole lines: QEMU may be halfway through writing the last one.
 */
export function ticksSince(consolePath: string, from = 0): number[] {
  if (!existsSync(consolePath)) return [];
  const text = readFileSync(consolePath).subarray(from).toString("utf8");
  return [...text.matchAll(/BC-GUEST tick=(\d+)\r?\n/g)].map((m) => Number(m[1]));
}

/** What the guest prints for an OpenSSH public key: the sha256 of the decoded key blob. */
export const keyBlobSha256 = (key: string) =>
  createHash("sha256")
    .update(Buffer.from(key.split(" ")[1] as string, "base64"))
    .digest("hex");

export const fileSha256 = (path: string) => createHash("sha256").update(readFileSync(path)).digest("hex");

/** A file the guest wrote into its root filesystem, read from the qcow2 overlay (converted, never mounted). */
export async function readFromDisk(overlay: string, file: string, scratch: string): Promise<string> {
  await sh("qemu-img", ["convert", "-O", "raw", overlay, scratch]);
  return sh("debugfs", ["-R", `cat ${file}`, scratch]);
}

/** The tiny guest's instance spec: 1 vCPU, 256 MiB, 1 GiB, booting the guest's base on `bridge`. */
export function tinySpec(id: string, o: { sha256: string; url?: string; bridge: string; mac: string }): InstanceSpec {
  return {
    id,
    power: "running",
    vcpus: 1,
    memoryMib: 256,
    diskGib: 1,
    gpus: [],
    image: { url: o.url ?? "", sha256: o.sha256, format: "qcow2" },
    sshKeys: [],
    userData: null,
    hostname: id,
    nic: { bridge: o.bridge, mac: o.mac, address: null, prefix: null, gateway: null },
  };
}
