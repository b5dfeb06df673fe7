/**
 * A tiny Linux guest for booting under real QEMU/libvirt in tests, built from Debian packages at test time:
 * the Debian cloud kernel, a busybox initramfs whose /init (guest-init.sh) reads the NoCloud seed and reports
 * on the serial console, and a 32 MiB ext4 base disk as qcow2.
 *
 * What the runtime must give the guest: machine `pc` (i440fx), the root disk as virtio-blk (/dev/vda), the
 * NoCloud seed ISO (label `cidata`) as an IDE cdrom, optionally a virtio-net NIC, and the serial console.
 * The cloud kernel has no AHCI, so a q35 machine's SATA cdrom would not be seen.
 */
import { type ExecFileException, execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { chmod, mkdir, mkdtemp, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { gunzipSync, gzipSync } from "node:zlib";

export interface Guest {
  /** Absolute path to vmlinuz. */
  kernel: string;
  /** Absolute path to the initramfs (gzip cpio, newc). */
  initrd: string;
  /** Absolute path to the base disk: an ext4 filesystem image converted to qcow2. */
  base: string;
  /** Hex sha256 of the base qcow2 file, as built. */
  sha256: string;
  /** Kernel command line to boot it. */
  cmdline: string;
}

/** Bump when the build changes in a way the kernel version and init script do not capture. */
const LAYOUT_VERSION = 1;
const INIT_SCRIPT = fileURLToPath(new URL("./guest-init.sh", import.meta.url));
/** Drivers for what the runtime attaches; their dependencies are added from the modules' own metadata. */
const WANTED_MODULES = ["virtio_pci", "virtio_blk", "virtio_net", "ata_piix", "sr_mod", "isofs", "ext4"];
/** ext4 checksums need crc32c; if ext4 is modular, the crypto driver is only a softdep, so ask for it too. */
const OPTIONAL_MODULES = ["crc32c_generic"];
/** The initramfs's /init mounts /dev/vda itself; root= is for whoever reads the domain definition. */
const CMDLINE = "console=ttyS0 root=/dev/vda";
/** Where a missing tool comes from, for the error message. */
const TOOL_PACKAGES: Record<string, string> = {
  "apt-cache": "apt",
  "apt-get": "apt",
  dpkg: "dpkg",
  "dpkg-query": "dpkg",
  modinfo: "kmod",
  xz: "xz-utils",
  zstd: "zstd",
  mke2fs: "e2fsprogs",
  "qemu-img": "qemu-utils",
};

interface KernelPackage {
  name: string;
  version: string;
}

interface Manifest {
  kernelPackage: string;
  kernelVersion: string;
  sha256: string;
  cmdline: string;
}

/** One module for the initramfs, named as the init script will insmod it. */
interface Module {
  name: string;
  file: string;
}

/** Builds in flight in this process, so concurrent callers share one build. */
const inFlight = new Map<string, Promise<Guest>>();

/** Build (or reuse from cacheDir) the guest. Throws loudly with the failing command's output if a tool or package is missing. */
export async function buildGuest(cacheDir: string = join(tmpdir(), "bc-kvm-guest")): Promise<Guest> {
  const dir = resolve(cacheDir);
  let pending = inFlight.get(dir);
  if (!pending) {
    pending = loadOrBuild(dir).finally(() => inFlight.delete(dir));
    inFlight.set(dir, pending);
  }
  return pending;
}

async function loadOrBuild(cacheDir: string): Promise<Guest> {
  await mkdir(cacheDir, { recursive: true, mode: 0o755 });
  const kernel = await newestCloudKernel(cacheDir);
  const initScript = await readFile(INIT_SCRIPT);
  const finalDir = join(cacheDir, cacheKey(kernel, initScript));
  const cached = await readGuest(finalDir);
  if (cached) return cached;

  await removeStaleBuilds(cacheDir);
  const work = await mkdtemp(join(cacheDir, ".tmp-"));
  try {
    await buildInto(work, kernel, initScript);
    // mkdtemp makes the directory 0700; libvirt's qemu user must be able to read the files.
    await chmod(work, 0o755);
    await publish(work, finalDir);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
  const built = await readGuest(finalDir);
  if (!built) throw new Error(`guest build finished but ${finalDir} has no guest.json`);
  return built;
}

function cacheKey(kernel: KernelPackage, initScript: Buffer): string {
  const hash = createHash("sha256")
    .update(JSON.stringify({ LAYOUT_VERSION, kernel, WANTED_MODULES, OPTIONAL_MODULES, CMDLINE }))
    .update(initScript)
    .digest("hex");
  return `${kernel.version.replace(/[^A-Za-z0-9.+-]/g, "_")}-${hash.slice(0, 16)}`;
}

/** Rename the finished build into place. Losing the race to another builder is fine: its result is the same. */
async function publish(work: string, finalDir: string): Promise<void> {
  try {
    await rename(work, finalDir);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code !== "ENOTEMPTY" && code !== "EEXIST") throw error;
  }
}

/** Interrupted builds leave .tmp-* directories; a build takes seconds, so an hour-old one is dead. */
async function removeStaleBuilds(cacheDir: string): Promise<void> {
  const cutoff = Date.now() - 60 * 60 * 1000;
  for (const entry of await readdir(cacheDir)) {
    if (!entry.startsWith(".tmp-")) continue;
    const path = join(cacheDir, entry);
    const info = await stat(path).catch(() => null);
    if (info && info.mtimeMs < cutoff) await rm(path, { recursive: true, force: true });
  }
}

/** The guest in a finished build directory, or null if there is none. */
async function readGuest(dir: string): Promise<Guest | null> {
  let text: string;
  try {
    text = await readFile(join(dir, "guest.json"), "utf8");
  } catch {
    return null;
  }
  const manifest = parseManifest(JSON.parse(text));
  return {
    kernel: join(dir, "vmlinuz"),
    initrd: join(dir, "initrd.img"),
    base: join(dir, "base.qcow2"),
    sha256: manifest.sha256,
    cmdline: manifest.cmdline,
  };
}

function parseManifest(value: unknown): Manifest {
  const m = (value ?? {}) as Record<string, unknown>;
  const fields = ["kernelPackage", "kernelVersion", "sha256", "cmdline"] as const;
  for (const field of fields) {
    if (typeof m[field] !== "string") throw new Error(`guest.json: ${field} is not a string`);
  }
  return m as unknown as Manifest;
}

// ---- the build -------------------------------------------------------------------------------------------

async function buildInto(work: string, kernel: KernelPackage, initScript: Buffer): Promise<void> {
  const unpacked = join(work, "pkg");
  const deb = await downloadKernel(kernel, work);
  await run("dpkg", ["-x", deb, unpacked]);
  const kver = await onlyEntry(join(unpacked, "lib", "modules"));
  await rename(join(unpacked, "boot", `vmlinuz-${kver}`), join(work, "vmlinuz"));

  const modules = await resolveModules(join(unpacked, "lib", "modules", kver));
  await writeFile(join(work, "initrd.img"), await makeInitramfs(initScript, modules));
  const sha256 = await makeBaseDisk(work);

  await rm(unpacked, { recursive: true, force: true });
  await rm(deb, { force: true });
  for (const file of ["vmlinuz", "initrd.img", "base.qcow2"]) await chmod(join(work, file), 0o644);
  const manifest: Manifest = { kernelPackage: kernel.name, kernelVersion: kernel.version, sha256, cmdline: CMDLINE };
  // Written last: a directory with guest.json is a complete build.
  await writeFile(join(work, "guest.json"), JSON.stringify(manifest, null, 2) + "\n", { mode: 0o644 });
}

/**
 * The newest linux-image-<abi>-cloud-amd64 with its candidate version. apt-cache is pointed at a package
 * cache file in cacheDir because this image disables apt's own, and rebuilding it costs ~0.5 s a call.
 */
async function newestCloudKernel(cacheDir: string): Promise<KernelPackage> {
  let found = await cloudKernels(cacheDir);
  if (found.length === 0) {
    await run("apt-get", ["update"]);
    found = await cloudKernels(cacheDir);
  }
  const newest = found.sort((a, b) => compareVersions(b.version, a.version))[0];
  if (!newest) throw new Error("apt knows no linux-image-*-cloud-amd64 package (is Debian main in the apt sources?)");
  return newest;
}

async function cloudKernels(cacheDir: string): Promise<KernelPackage[]> {
  const pkgcache = `Dir::Cache::pkgcache=${join(cacheDir, "apt-pkgcache.bin")}`;
  const out = await run("apt-cache", ["-o", pkgcache, "policy", "^linux-image-.*-cloud-amd64$"]);
  const found: KernelPackage[] = [];
  let name = "";
  for (const line of out.split("\n")) {
    if (/^\S.*:$/.test(line)) name = line.slice(0, -1);
    const candidate = /^\s+Candidate:\s+(\S+)/.exec(line)?.[1];
    // Only ABI-versioned names: not the linux-image-6.12-cloud-amd64 meta-package, -dbg or -unsigned.
    if (candidate && candidate !== "(none)" && /^linux-image-\d+\.\d+\.\d+\S*-cloud-amd64$/.test(name)) {
      found.push({ name, version: candidate });
    }
  }
  return found;
}

/** Orders Debian versions by their numeric runs; enough to rank kernel packages (6.12.117-1~deb12u1 > 6.1.176-1). */
function compareVersions(a: string, b: string): number {
  const na = (a.match(/\d+/g) ?? []).map(Number);
  const nb = (b.match(/\d+/g) ?? []).map(Number);
  for (let i = 0; i < Math.max(na.length, nb.length); i++) {
    const d = (na[i] ?? -1) - (nb[i] ?? -1);
    if (d !== 0) return d;
  }
  return 0;
}

/** apt-get download into dir (never installs); refreshes the lists once if they are stale or missing. */
async function downloadKernel(kernel: KernelPackage, dir: string): Promise<string> {
  // Root downloading into a private temp dir: apt's _apt sandbox user could not write there.
  const args = ["-o", "APT::Sandbox::User=root", "download", `${kernel.name}=${kernel.version}`];
  try {
    await run("apt-get", args, dir);
  } catch {
    await run("apt-get", ["update"]);
    await run("apt-get", args, dir);
  }
  const deb = (await readdir(dir)).find((f) => f.endsWith(".deb"));
  if (!deb) throw new Error(`apt-get download ${kernel.name} left no .deb in ${dir}`);
  return join(dir, deb);
}

async function onlyEntry(dir: string): Promise<string> {
  const entries = await readdir(dir);
  if (entries.length !== 1 || !entries[0]) throw new Error(`expected one kernel in ${dir}, found: ${entries.join(", ") || "none"}`);
  return entries[0];
}

// ---- kernel modules ----------------------------------------------------------------------------------------

const modName = (file: string) => file.replace(/\.ko(\.(xz|gz|zst))?$/, "").replace(/-/g, "_");

/**
 * WANTED_MODULES and everything they depend on, dependencies first (the order insmod needs). Built-in
 * drivers are skipped. The package ships no modules.dep (depmod runs at install), so read each module's
 * own depends= and pre-softdeps with modinfo.
 */
async function resolveModules(modulesDir: string): Promise<Module[]> {
  const builtin = new Set((await readFile(join(modulesDir, "modules.builtin"), "utf8")).split("\n").map((l) => modName(l.split("/").pop() ?? "")));
  const files = await indexModuleFiles(join(modulesDir, "kernel"));
  const ordered: Module[] = [];
  const seen = new Set<string>();

  async function visit(wanted: string, optional: boolean, chain: string[]): Promise<void> {
    const name = modName(wanted);
    if (builtin.has(name) || seen.has(name)) return;
    const file = files.get(name);
    if (!file) {
      if (optional) return;
      throw new Error(`kernel module ${name} (needed by ${chain.join(" <- ") || "the guest"}) is neither built in nor in ${modulesDir}`);
    }
    seen.add(name);
    const { depends, softPre } = await moduleDeps(file);
    for (const dep of depends) await visit(dep, false, [name, ...chain]);
    for (const dep of softPre) await visit(dep, true, [name, ...chain]);
    ordered.push({ name, file });
  }

  for (const name of WANTED_MODULES) await visit(name, false, []);
  for (const name of OPTIONAL_MODULES) await visit(name, true, []);
  return ordered;
}

async function indexModuleFiles(dir: string): Promise<Map<string, string>> {
  const index = new Map<string, string>();
  for (const entry of await readdir(dir, { recursive: true, withFileTypes: true })) {
    if (entry.isFile() && /\.ko(\.(xz|gz|zst))?$/.test(entry.name)) index.set(modName(entry.name), join(entry.parentPath, entry.name));
  }
  return index;
}

async function moduleDeps(file: string): Promise<{ depends: string[]; softPre: string[] }> {
  const depends = (await run("modinfo", ["-F", "depends", file])).trim();
  // softdep lines look like "pre: crc32c post: foo"; only "pre" must be loaded first.
  const softdep = (await run("modinfo", ["-F", "softdep", file])).trim();
  const softPre = /pre:\s*([^:]*?)(\s+post:|$)/.exec(softdep)?.[1]?.split(/\s+/) ?? [];
  return { depends: depends ? depends.split(",") : [], softPre: softPre.filter(Boolean) };
}

/** busybox insmod cannot read compressed modules, so unpack them here. */
async function moduleBytes(file: string): Promise<Buffer> {
  if (file.endsWith(".xz")) return exec("xz", ["-dc", file]);
  if (file.endsWith(".zst")) return exec("zstd", ["-dc", file]);
  if (file.endsWith(".gz")) return gunzipSync(await readFile(file));
  return readFile(file);
}

// ---- initramfs ---------------------------------------------------------------------------------------------

interface CpioEntry {
  path: string;
  mode: number;
  data?: Buffer;
  /** Major and minor number of a device node. */
  rdev?: [number, number];
}

async function makeInitramfs(initScript: Buffer, modules: Module[]): Promise<Buffer> {
  // A dynamically linked busybox would find no libc in the initramfs.
  const status = await run("dpkg-query", ["-s", "busybox-static"]).catch(() => "");
  if (!/^Status: install ok installed$/m.test(status)) throw new Error("busybox-static is not installed (apt-get install busybox-static)");

  const dirs = ["bin", "dev", "etc", "lib", "lib/modules", "mnt", "proc", "seed", "sys", "tmp"];
  const entries: CpioEntry[] = dirs.map((path) => ({ path, mode: 0o040755 }));
  // The kernel opens /dev/console for init's stdio before anything is mounted.
  entries.push({ path: "dev/console", mode: 0o020600, rdev: [5, 1] });
  entries.push({ path: "bin/busybox", mode: 0o100755, data: await readFile("/bin/busybox") });
  entries.push({ path: "init", mode: 0o100755, data: initScript });
  entries.push({ path: "etc/bc-modules", mode: 0o100644, data: Buffer.from(modules.map((m) => m.name + "\n").join("")) });
  for (const m of modules) entries.push({ path: `lib/modules/${m.name}.ko`, mode: 0o100644, data: await moduleBytes(m.file) });
  return gzipSync(cpioNewc(entries), { level: 9 });
}

/** The "newc" cpio format the kernel unpacks: a hex ASCII header, the name, the data, each padded to 4 bytes. */
function cpioNewc(entries: CpioEntry[]): Buffer {
  const parts: Buffer[] = [];
  const pad = (n: number) => Buffer.alloc((4 - (n % 4)) % 4);
  const hex = (n: number) => n.toString(16).padStart(8, "0");
  const add = (ino: number, e: CpioEntry) => {
    const data = e.data ?? Buffer.alloc(0);
    const name = Buffer.from(e.path + "\0");
    const [major, minor] = e.rdev ?? [0, 0];
    const isDir = (e.mode & 0o170000) === 0o040000;
    const fields = [ino, e.mode, 0, 0, isDir ? 2 : 1, 0, data.length, 0, 0, major, minor, name.length, 0];
    const header = Buffer.from("070701" + fields.map(hex).join(""));
    parts.push(header, name, pad(header.length + name.length), data, pad(data.length));
  };
  for (const [i, e] of entries.entries()) add(i + 1, e);
  add(0, { path: "TRAILER!!!", mode: 0 });
  return Buffer.concat(parts);
}

// ---- base disk ---------------------------------------------------------------------------------------------

/** mke2fs -d fills the filesystem from a directory, so no mount or loop device is needed. Returns its sha256. */
async function makeBaseDisk(work: string): Promise<string> {
  const root = join(work, "rootfs");
  const raw = join(work, "base.raw");
  const qcow = join(work, "base.qcow2");
  await mkdir(join(root, "etc"), { recursive: true });
  await writeFile(join(root, "etc", "bc-base"), "bc test base\n");
  await run("mke2fs", ["-q", "-t", "ext4", "-L", "bcroot", "-d", root, raw, "32M"]);
  await run("qemu-img", ["convert", "-O", "qcow2", raw, qcow]);
  await rm(raw);
  await rm(root, { recursive: true });
  return sha256File(qcow);
}

function sha256File(path: string): Promise<string> {
  return new Promise((resolveHash, reject) => {
    const hash = createHash("sha256");
    createReadStream(path)
      .on("data", (chunk) => hash.update(chunk))
      .on("error", reject)
      .on("end", () => resolveHash(hash.digest("hex")));
  });
}

// ---- running tools -----------------------------------------------------------------------------------------

async function run(cmd: string, args: string[], cwd?: string): Promise<string> {
  return (await exec(cmd, args, cwd)).toString("utf8");
}

function exec(cmd: string, args: string[], cwd?: string): Promise<Buffer> {
  return new Promise((resolveOut, reject) => {
    execFile(cmd, args, { cwd, encoding: "buffer", maxBuffer: 512 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error) reject(commandError(cmd, args, error, stdout.toString(), stderr.toString()));
      else resolveOut(stdout);
    });
  });
}

function commandError(cmd: string, args: string[], error: ExecFileException, stdout: string, stderr: string): Error {
  if (error.code === "ENOENT") {
    const pkg = TOOL_PACKAGES[cmd];
    return new Error(`guest build: ${cmd} not found${pkg ? ` (apt-get install ${pkg})` : ""}`);
  }
  const output = [stderr.trim(), stdout.trim()].filter(Boolean).join("\n").slice(-4000);
  return new Error(`guest build: ${cmd} ${args.join(" ")} failed (exit ${error.code ?? error.signal}):\n${output}`);
}
