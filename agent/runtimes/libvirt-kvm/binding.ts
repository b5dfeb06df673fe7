import { RuntimeError } from "../runtime.ts";

/** What the Node binding (@unraid/libvirt, an optional dependency) exposes, as far as this runtime uses it. */
interface Binding {
  Hypervisor: new (o: { uri: string }) => Hypervisor;
}
export type Dom = object;
export interface Hypervisor {
  connectOpen(): Promise<void>;
  connectClose(): Promise<void>;
  connectListAllDomains(): Promise<Dom[]>;
  domainLookupByName(name: string): Promise<Dom>;
  domainDefineXML(xml: string): Promise<Dom>;
  domainCreate(d: Dom): Promise<void>;
  domainShutdown(d: Dom): Promise<void>;
  domainDestroy(d: Dom): Promise<void>;
  domainUndefine(d: Dom): Promise<void>;
  domainSuspend(d: Dom): Promise<void>;
  domainResume(d: Dom): Promise<void>;
  domainSave(d: Dom, path: string): Promise<void>;
  domainRestore(path: string): Promise<void>;
  domainGetName(d: Dom): Promise<string>;
  domainGetInfo(d: Dom): Promise<{ state: number; maxMem: number; nrVirtCpu: number }>;
  domainGetXMLDesc(d: Dom, flags?: number): Promise<string>;
  nodeGetInfo(): Promise<{ cpus: number; memory: number }>;
}

/** A connection to libvirtd through the optional binding; a clear RuntimeError where it was not built. */
export async function openLibvirt(uri = "qemu:///system"): Promise<Hypervisor> {
  let binding: Binding;
  try {
    binding = (await import("@unraid/libvirt" as string)) as Binding;
  } catch (e) {
    throw new RuntimeError(`the libvirt-kvm runtime needs the optional @unraid/libvirt binding (built with libvirt-dev at npm install): ${e}`, true);
  }
  const hv = new binding.Hypervisor({ uri });
  await hv.connectOpen();
  return hv;
}

/**
 * libvirtd's socket for a local URI (the binding's connection cannot carry guest agent commands: ./rpc.ts).
 * `?socket=` as in libvirt's own URIs; null for a remote one.
 */
export function daemonSocket(uri = "qemu:///system"): string | null {
  const m = /^qemu(?:\+unix)?:\/\/\/system(?:\?(.*))?$/.exec(uri);
  if (!m) return null;
  return new URLSearchParams(m[1] ?? "").get("socket") ?? "/run/libvirt/libvirt-sock";
}
