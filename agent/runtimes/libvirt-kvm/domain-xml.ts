import { type InstanceSpec, tapFor } from "../../../contracts/host.ts";

/**
 * The libvirt domain of an instance, as XML. Pure, so every branch (domain type, direct kernel boot, GPUs) is
 * tested without a hypervisor.
 */

export type DomainType = "kvm" | "qemu";

export interface DomainPaths {
  overlay: string;
  seed: string;
  console: string;
}

/** Hosts whose images are root filesystems rather than bootable disks give every domain this kernel. */
export interface DirectBoot {
  kernel: string;
  initrd?: string;
  cmdline: string;
}

export interface DomainOptions {
  type: DomainType;
  /** The runtime that made it: a host's runtime lists and touches only its own domains. */
  owner: string;
  paths: DomainPaths;
  boot?: DirectBoot;
}

export const OWNER_NS = "urn:better-compute:instance";

/** Whether a domain's XML says `owner` made it. */
export const ownedBy = (xml: string, owner: string) =>
  /^[0-9a-z-]+$/i.test(owner) && new RegExp(`<\\w+:instance[^>]*\\bowner=["']${owner}["']`).test(xml) && xml.includes(OWNER_NS);

export const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;").replace(/'/g, "&apos;");

/** `0000:65:00.0` → libvirt's address attributes; anything else is refused rather than guessed. */
export function pciAddress(addr: string): string {
  const m = /^([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$/.exec(addr);
  if (!m) throw new Error(`not a PCI address: ${addr}`);
  return `<address domain='0x${m[1]}' bus='0x${m[2]}' slot='0x${m[3]}' function='0x${m[4]}'/>`;
}

export function domainXml(spec: InstanceSpec, o: DomainOptions): string {
  const os = o.boot
    ? [
        `<kernel>${esc(o.boot.kernel)}</kernel>`,
        ...(o.boot.initrd ? [`<initrd>${esc(o.boot.initrd)}</initrd>`] : []),
        `<cmdline>${esc(o.boot.cmdline)}</cmdline>`,
      ]
    : ["<boot dev='hd'/>"];
  // Whole GPUs, passed through by address; `managed` lets libvirt bind them to vfio-pci and back.
  const gpus = spec.gpus.map((g) => {
    if (!g.pciAddress) throw new Error(`GPU ${g.model} of ${spec.id} has no PCI address`);
    return `<hostdev mode='subsystem' type='pci' managed='yes'><source>${pciAddress(g.pciAddress)}</source></hostdev>`;
  });
  return [
    `<domain type='${o.type}'>`,
    `<name>${esc(spec.id)}</name>`,
    `<metadata><bc:instance xmlns:bc='${OWNER_NS}' owner='${esc(o.owner)}'>${esc(spec.id)}</bc:instance></metadata>`,
    `<memory unit='MiB'>${spec.memoryMib}</memory>`,
    `<vcpu>${spec.vcpus}</vcpu>`,
    // machine `pc`: its IDE cdrom needs no AHCI driver, which minimal (cloud) kernels lack.
    `<os><type arch='x86_64' machine='pc'>hvm</type>${os.join("")}</os>`,
    "<features><acpi/><apic/></features>",
    // host-passthrough only under KVM: emulation (TCG) has no host CPU to pass through.
    o.type === "kvm" ? "<cpu mode='host-passthrough'/>" : "",
    // A crash is kept for the platform to see and act on (./states.ts), never destroyed or restarted unseen.
    "<on_poweroff>destroy</on_poweroff><on_reboot>restart</on_reboot><on_crash>preserve</on_crash>",
    "<devices>",
    `<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='${esc(o.paths.overlay)}'/><target dev='vda' bus='virtio'/></disk>`,
    `<disk type='file' device='cdrom'><driver name='qemu' type='raw'/><source file='${esc(o.paths.seed)}'/><target dev='hdc' bus='ide'/><readonly/></disk>`,
    // The tap is enslaved to the bridge by libvirt when the domain starts, before the guest runs. Its name is
    // the instance's (tapFor), so the host's egress rules can match the instance's traffic by interface.
    `<interface type='bridge'><source bridge='${esc(spec.nic.bridge)}'/><mac address='${esc(spec.nic.mac)}'/><target dev='${esc(tapFor(spec.id))}'/><model type='virtio'/></interface>`,
    `<serial type='file'><source path='${esc(o.paths.console)}' append='on'/><target port='0'/></serial>`,
    "<console type='pty'><target type='serial' port='0'/></console>",
    // The QEMU guest agent's port (exec, ./guest-exec.ts): libvirt adds the virtio-serial controller and the
    // host socket and connects to it itself; a guest running qemu-ga finds the port by this name.
    "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>",
    ...gpus,
    // pvpanic: a guest kernel that panics says so, and libvirt shows the domain crashed instead of hung.
    "<panic model='isa'/>",
    "<memballoon model='none'/>",
    "</devices>",
    "</domain>",
  ]
    .filter(Boolean)
    .join("\n");
}
