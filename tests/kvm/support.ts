import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream, existsSync, readFileSync } from "node:fs";
import { chmod, copyFile, mkdir, mkdtemp, readdir, rename, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { promisify } from "node:util";
import { openLibvirt } from "../../agent/runtimes/libvirt-kvm/index.ts";
import type { InstanceSpec } from "../../contracts/host.ts";
import { buildGuest, type Guest } from "./guest.ts";

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
    env: {},
    network: { egress: "all", allow: [] },
    fromSnapshot: null,
  };
}

/**
 * PID 1 of the agent guest (`rdinit=/agent-init`): starts the QEMU guest agent and a counter in the background,
 * then hands PID 1 to the guest's own /init (guest-init.sh), which mounts /proc, /sys and /dev and reports on the
 * console as before. There is no udev: the agent's port is found by its name in sysfs. The counter is written
 * to /tmp/bc-counter every 100 ms and kept only in memory, so a guest restored from a snapshot goes on from
 * the saved value.
 */
const AGENT_INIT = `#!/bin/busybox sh
B=/bin/busybox
export PATH=/bin:/usr/sbin HOME=/root TERM=linux
agent() {
  # Until the guest's /init has mounted sysfs and devtmpfs and installed busybox's applets.
  while [ ! -x /bin/sh ] || [ ! -d /sys/class/virtio-ports ] || [ ! -c /dev/null ]; do $B sleep 0.1; done
  $B mkdir -p /tmp/qga /root
  while :; do
    port=
    for f in /sys/class/virtio-ports/*/name; do
      [ "$($B cat "$f" 2>/dev/null)" = org.qemu.guest_agent.0 ] && port=$($B basename "$($B dirname "$f")")
    done
    if [ -n "$port" ] && [ -c "/dev/$port" ]; then
      echo "BC-GUEST agent=$port"
      /usr/sbin/qemu-ga -m virtio-serial -p "/dev/$port" -t /tmp/qga -f /tmp/qga/pid </dev/null
      echo "BC-GUEST agent-exited=$?"
    fi
    $B sleep 0.5
  done
}
counter() {
  while [ ! -x /bin/sh ]; do $B sleep 0.1; done
  n=0
  while :; do
    n=$((n + 1))
    echo "$n" >/tmp/bc-counter.new && $B mv /tmp/bc-counter.new /tmp/bc-counter
    $B sleep 0.1
  done
}
# The shell gives a background job /dev/null as stdin, which exists only once devtmpfs is mounted (the guest's
# /init mounts it again over this one: the same devices).
$B mount -t devtmpfs devtmpfs /dev
agent &
counter &
exec /init
`;

/** The test guest with the QEMU guest agent (see AGENT_INIT) and the version of the agent's package. */
export interface AgentGuest extends Guest {
  agentVersion: string;
}

const AGENT_LAYOUT = 1;

/**
 * The guest of ./guest.ts with a second initramfs layer (the kernel unpacks concatenated archives in order):
 * qemu-ga from Debian's qemu-guest-agent package, the libraries it links copied from this host (a bookworm,
 * like the package: `ldd` on the unpacked binary names them), a one-line /etc/passwd and /agent-init. Cached
 * by its inputs beside the plain guest's cache.
 */
export async function buildAgentGuest(cacheDir = join(tmpdir(), "bc-kvm-agent-guest")): Promise<AgentGuest> {
  const guest = await buildGuest();
  const version = /Candidate:\s+(\S+)/.exec(await sh("apt-cache", ["policy", "qemu-guest-agent"]))?.[1];
  if (!version || version === "(none)") throw new Error("apt knows no qemu-guest-agent package (is Debian main in the apt sources?)");
  const key = createHash("sha256")
    .update(JSON.stringify({ AGENT_LAYOUT, version, AGENT_INIT, initrd: fileSha256(guest.initrd), cmdline: guest.cmdline }))
    .digest("hex");
  const initrd = join(cacheDir, key.slice(0, 16), "initrd.img");
  const built: AgentGuest = { ...guest, initrd, cmdline: `${guest.cmdline} rdinit=/agent-init`, agentVersion: version };
  if (existsSync(initrd)) return built;
  await mkdir(cacheDir, { recursive: true, mode: 0o755 });
  const work = await mkdtemp(join(cacheDir, ".tmp-"));
  try {
    // apt-get download writes into the current directory, as root (its sandbox user could not write here).
    const download = () => sh("sh", ["-c", `cd "$1" && apt-get -q -o APT::Sandbox::User=root download "qemu-guest-agent=$2"`, "sh", work, version]);
    await download().catch(async () => {
      await sh("apt-get", ["update", "-q"]);
      return download();
    });
    const deb = (await readdir(work)).find((f) => f.endsWith(".deb"));
    if (!deb) throw new Error(`apt-get download qemu-guest-agent left no .deb in ${work}`);
    const pkg = join(work, "pkg");
    await sh("dpkg", ["-x", join(work, deb), pkg]);
    const layer = join(work, "layer");
    for (const d of ["usr/sbin", "lib/x86_64-linux-gnu", "lib64", "etc"]) await mkdir(join(layer, d), { recursive: true });
    await copyFile(join(pkg, "usr/sbin/qemu-ga"), join(layer, "usr/sbin/qemu-ga"));
    for (const line of (await sh("ldd", [join(pkg, "usr/sbin/qemu-ga")])).split("\n")) {
      const lib = /=>\s+(\/\S+)/.exec(line)?.[1] ?? /^\s*(\/lib64\/\S+)/.exec(line)?.[1];
      // copyFile follows the host's symlinks: the guest gets each library's bytes under the name it is asked by.
      if (lib) await copyFile(lib, join(layer, lib.startsWith("/lib64/") ? "lib64" : "lib/x86_64-linux-gnu", basename(lib)));
    }
    await writeFile(join(layer, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n");
    await writeFile(join(layer, "agent-init"), AGENT_INIT, { mode: 0o755 });
    const cpio = join(work, "layer.cpio.gz");
    await sh("sh", ["-c", `cd "$1" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -9 >"$2"`, "sh", layer, cpio]);
    const tmp = join(work, "initrd.img");
    await writeFile(tmp, Buffer.concat([readFileSync(guest.initrd), readFileSync(cpio)]), { mode: 0o644 });
    await mkdir(dirname(initrd), { recursive: true, mode: 0o755 });
    await rename(tmp, initrd);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
  return built;
}
