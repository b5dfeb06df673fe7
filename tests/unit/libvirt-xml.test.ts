import { describe, expect, it } from "vitest";
import { cloneXml } from "../../agent/runtimes/libvirt-kvm/clone.ts";
import { domainXml, ownedBy, pciAddress } from "../../agent/runtimes/libvirt-kvm/domain-xml.ts";
import { detectDomainType } from "../../agent/runtimes/libvirt-kvm/host.ts";
import { type InstanceSpec, tapFor } from "../../contracts/host.ts";

const spec = (over: Partial<InstanceSpec> = {}): InstanceSpec => ({
  id: "inst_abc",
  power: "running",
  vcpus: 2,
  memoryMib: 512,
  diskGib: 4,
  gpus: [],
  image: { url: "http://127.0.0.1/base.qcow2", sha256: "a".repeat(64), format: "qcow2" },
  sshKeys: [],
  userData: null,
  hostname: "web-1",
  nic: { bridge: "br-bc", mac: "52:54:00:aa:bb:cc", address: "10.0.0.2", prefix: 24, gateway: "10.0.0.1" },
  env: {},
  network: { egress: "all", allow: [] },
  fromSnapshot: null,
  ...over,
});
const paths = { overlay: "/var/lib/bc/inst_abc/overlay.qcow2", seed: "/var/lib/bc/inst_abc/seed.iso", console: "/var/lib/bc/inst_abc/console.log" };

describe("libvirt domain XML", () => {
  it("names the domain by its instance, sizes it, and wires disk, seed, bridge NIC and serial log", () => {
    const xml = domainXml(spec(), { type: "qemu", owner: "o1", paths });
    expect(xml).toContain("<domain type='qemu'>");
    expect(xml).toContain("<name>inst_abc</name>");
    expect(xml).toContain("<memory unit='MiB'>512</memory>");
    expect(xml).toContain("<vcpu>2</vcpu>");
    expect(xml).toContain(`<source file='${paths.overlay}'/><target dev='vda' bus='virtio'/>`);
    expect(xml).toMatch(/device='cdrom'>.*seed\.iso.*bus='ide'/);
    expect(xml).toContain("<interface type='bridge'><source bridge='br-bc'/><mac address='52:54:00:aa:bb:cc'/>");
    // The tap is named for the instance (the host's egress rules match it), and the guest agent has its port.
    expect(xml).toContain(`<target dev='${tapFor("inst_abc")}'/>`);
    expect(xml).toContain("<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>");
    expect(xml).toContain(`<serial type='file'><source path='${paths.console}' append='on'/>`);
    expect(xml).toContain("<boot dev='hd'/>");
    expect(xml).not.toContain("host-passthrough");
    expect(xml).not.toContain("hostdev");
  });

  it("passes the host CPU through under KVM only, and boots a given kernel when the host supplies one", () => {
    const xml = domainXml(spec(), {
      type: "kvm",
      owner: "o1",
      paths,
      boot: { kernel: "/k/vmlinuz", initrd: "/k/initrd", cmdline: "console=ttyS0 root=/dev/vda" },
    });
    expect(xml).toContain("<domain type='kvm'>");
    expect(xml).toContain("<cpu mode='host-passthrough'/>");
    expect(xml).toContain("<kernel>/k/vmlinuz</kernel><initrd>/k/initrd</initrd><cmdline>console=ttyS0 root=/dev/vda</cmdline>");
    expect(xml).not.toContain("<boot dev='hd'/>");
  });

  it("passes whole GPUs through as VFIO hostdevs at the addresses the node reported", () => {
    const xml = domainXml(
      spec({
        gpus: [
          { model: "nvidia-a100", pciAddress: "0000:65:00.0" },
          { model: "nvidia-a100", pciAddress: "0000:b3:00.1" },
        ],
      }),
      { type: "kvm", owner: "o1", paths },
    );
    expect(xml).toContain(
      "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x65' slot='0x00' function='0x0'/></source></hostdev>",
    );
    expect(xml).toContain("<address domain='0x0000' bus='0xb3' slot='0x00' function='0x1'/>");
    expect(() => domainXml(spec({ gpus: [{ model: "x", pciAddress: null }] }), { type: "kvm", owner: "o1", paths })).toThrow(/no PCI address/);
    expect(() => pciAddress("65:00.0'/><evil")).toThrow(/not a PCI address/);
  });

  it("marks the runtime that made it, as libvirt gives it back", () => {
    const xml = domainXml(spec(), { type: "qemu", owner: "3f1c-aa", paths });
    expect(ownedBy(xml, "3f1c-aa")).toBe(true);
    const normalized = `<metadata>\n  <bc:instance xmlns:bc="urn:better-compute:instance" owner="3f1c-aa">inst_abc</bc:instance>\n</metadata>`;
    expect(ownedBy(normalized, "3f1c-aa")).toBe(true);
    expect(ownedBy(normalized, "3f1c-ab")).toBe(false);
    expect(ownedBy("<domain><name>inst_abc</name></domain>", "3f1c-aa")).toBe(false);
  });

  it("escapes what comes from the spec", () => {
    const xml = domainXml(spec({ nic: { ...spec().nic, bridge: "br'><x" } }), { type: "qemu", owner: "o1", paths });
    expect(xml).toContain("br&apos;&gt;&lt;x");
  });
});

describe("a clone's domain XML, from the source's saved one", () => {
  const from = `inst_${"a".repeat(52)}`;
  const to = `inst_${"b".repeat(52)}`;
  // As libvirt formats a saved domain (virsh save-image-dumpxml), abridged.
  const saved = `<domain type='qemu'>
  <name>${from}</name>
  <uuid>c0352bcf-d463-43dc-bcce-b7b5acfec07b</uuid>
  <metadata>
    <bc:instance xmlns:bc="urn:better-compute:instance" owner="o1">${from}</bc:instance>
  </metadata>
  <devices>
    <disk type='file' device='disk'>
      <source file='/var/lib/bc/instances/${from}/overlay.qcow2'/>
      <target dev='vda' bus='virtio'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x04' function='0x0'/>
    </disk>
    <interface type='bridge'>
      <mac address='52:54:00:11:22:33'/>
      <source bridge='br-bc'/>
      <target dev='${tapFor(from)}'/>
      <model type='virtio'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x0'/>
    </interface>
    <serial type='file'><source path='/var/lib/bc/instances/${from}/console.log' append='on'/></serial>
  </devices>
</domain>`;
  const identity = { fromId: from, id: to, uuid: "11111111-2222-3333-4444-555555555555", mac: "52:54:00:44:55:66", tap: tapFor(to), owner: "o2" };

  it("takes the clone's name, uuid, owner, files, MAC and tap, and keeps the saved hardware and its addresses", () => {
    const xml = cloneXml(saved, identity);
    expect(xml).not.toContain(from);
    expect(xml).toContain(`<name>${to}</name>`);
    expect(xml).toContain("<uuid>11111111-2222-3333-4444-555555555555</uuid>");
    expect(xml).toMatch(new RegExp(`owner='o2'>${to}</bc:instance>`));
    expect(ownedBy(xml, "o2")).toBe(true);
    expect(xml).toContain(`<source file='/var/lib/bc/instances/${to}/overlay.qcow2'/>`);
    expect(xml).toContain(`<source path='/var/lib/bc/instances/${to}/console.log' append='on'/>`);
    expect(xml).toContain(`<mac address='52:54:00:44:55:66'/><target dev='${tapFor(to)}'/>`);
    expect(xml).not.toContain(tapFor(from));
    expect(xml).not.toContain("52:54:00:11:22:33");
    expect(xml).toContain("slot='0x02'");
    expect(xml).toContain("slot='0x04'");
  });

  it("names the tap where the saved domain had a generated one, and refuses what it cannot rename", () => {
    const untapped = saved.replace(/\s*<target dev='bct[^']*'\/>/, "");
    expect(cloneXml(untapped, identity)).toContain(`<mac address='52:54:00:44:55:66'/><target dev='${tapFor(to)}'/>`);
    const twoNics = saved.replace(/(<interface[\s\S]*?<\/interface>)/, "$1$1");
    expect(() => cloneXml(twoNics, identity)).toThrow(/2 network interfaces/);
  });
});

describe("domain type", () => {
  const host = (flags: string, files: string[]) =>
    detectDomainType(
      () => `processor: 0\nflags\t\t: fpu ${flags} sse\n`,
      (p) => files.includes(p),
    );
  it("is kvm with hardware virtualisation and a plain kvm module", () => {
    expect(host("vmx", ["/dev/kvm"])).toBe("kvm");
    expect(host("svm", ["/dev/kvm"])).toBe("kvm");
  });
  it("is qemu (emulation) without vmx/svm, without /dev/kvm, or under KVM-PVM", () => {
    expect(host("", ["/dev/kvm"])).toBe("qemu");
    expect(host("vmx", [])).toBe("qemu");
    expect(host("vmx", ["/dev/kvm", "/sys/module/kvm_pvm"])).toBe("qemu");
  });
});
