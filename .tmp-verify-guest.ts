import { execFileSync, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, rmSync, writeFileSync, mkdirSync } from "node:fs";
import { buildGuest } from "./tests/kvm/guest.ts";

const cacheDir = process.env.CACHE ?? "/tmp/kvmtest/cache";
const w = "/tmp/kvmtest/run";
rmSync(w, { recursive: true, force: true });
mkdirSync(w, { recursive: true });

let t = performance.now();
const g = await buildGuest(cacheDir);
console.log("first buildGuest ms", Math.round(performance.now() - t), g);
t = performance.now();
const g2 = await buildGuest(cacheDir);
console.log("second buildGuest ms", Math.round(performance.now() - t), JSON.stringify(g2) === JSON.stringify(g));

const blob = Buffer.concat([Buffer.from([0, 0, 0, 11]), Buffer.from("ssh-ed25519"), Buffer.from([0, 0, 0, 32]), Buffer.alloc(32, 7)]);
const keySha = createHash("sha256").update(blob).digest("hex");
writeFileSync(`${w}/meta-data`, "instance-id: inst_test\nlocal-hostname: test-host\n");
writeFileSync(`${w}/user-data`, `#cloud-config\nssh_authorized_keys:\n  - ssh-ed25519 ${blob.toString("base64")} me@laptop\n`);
execFileSync("genisoimage", ["-quiet", "-output", `${w}/seed.iso`, "-volid", "cidata", "-joliet", "-rock", `${w}/user-data`, `${w}/meta-data`]);
execFileSync("qemu-img", ["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", g.base, `${w}/overlay.qcow2`]);

const log = `${w}/console.log`;
const nic = process.env.NIC ? ["-nic", "user,model=virtio-net-pci,mac=52:54:00:AB:CD:EF"] : ["-nic", "none"];
t = performance.now();
const q = spawn("qemu-system-x86_64", ["-machine", "pc,accel=tcg", "-m", "256", "-nographic", "-kernel", g.kernel, "-initrd", g.initrd, "-append", g.cmdline,
  "-drive", `file=${w}/overlay.qcow2,if=virtio,format=qcow2`, "-drive", `file=${w}/seed.iso,media=cdrom,if=ide`, ...nic, "-serial", `file:${log}`, "-display", "none", "-monitor", "none"], { stdio: "inherit" });
let ok = false;
while (performance.now() - t < 90_000) {
  if (existsSync(log) && readFileSync(log, "utf8").includes("BC-GUEST ready")) { ok = true; break; }
  await new Promise((r) => setTimeout(r, 100));
}
const bootMs = Math.round(performance.now() - t);
q.kill("SIGKILL");
await new Promise((r) => q.once("exit", r));
const out = readFileSync(log, "utf8");
console.log(out);
console.log("ready:", ok, "boot ms", bootMs);
const lines = out.split(/\r?\n/).filter((l) => l.startsWith("BC-GUEST"));
console.log(lines);
console.log("iid ok", lines.includes("BC-GUEST instance-id=inst_test"));
console.log("key ok", lines.includes(`BC-GUEST ssh-key-sha256=${keySha}`));
execFileSync("qemu-img", ["convert", "-O", "raw", `${w}/overlay.qcow2`, `${w}/x.raw`]);
console.log("debugfs:", JSON.stringify(execFileSync("debugfs", ["-R", "cat /bc-inst_test", `${w}/x.raw`], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] })));
const baseSha = createHash("sha256").update(readFileSync(g.base)).digest("hex");
console.log("base sha unchanged", baseSha === g.sha256);
