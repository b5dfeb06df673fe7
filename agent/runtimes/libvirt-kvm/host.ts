import { existsSync, readFileSync, statfsSync } from "node:fs";
import type { DomainType } from "./domain-xml.ts";

/**
 * KVM only where the CPU offers hardware virtualisation (vmx or svm) and the kvm module is not KVM-PVM, which
 * runs only PVM-enlightened guest kernels: a stock kernel starts there but never reaches init. Elsewhere QEMU
 * emulates (TCG): slower, but it boots.
 */
export function detectDomainType(read: (p: string) => string | null = readOrNull, exists: (p: string) => boolean = existsSync): DomainType {
  const cpuinfo = read("/proc/cpuinfo") ?? "";
  const hardware = /^flags\s*:.*\b(vmx|svm)\b/m.test(cpuinfo);
  const pvm = exists("/sys/module/kvm_pvm");
  return hardware && !pvm && exists("/dev/kvm") ? "kvm" : "qemu";
}

function readOrNull(p: string): string | null {
  try {
    return readFileSync(p, "utf8");
  } catch {
    return null;
  }
}

/** The size of the filesystem the overlays live on, in whole GiB: what placement may hand out here. */
export function diskGib(dir: string): number {
  const s = statfsSync(dir);
  return Math.floor((Number(s.blocks) * Number(s.bsize)) / 2 ** 30);
}
