import { constants } from "node:fs";
import { copyFile, open } from "node:fs/promises";
import { RuntimeError } from "../runtime.ts";
import { esc } from "./domain-xml.ts";

/**
 * A new domain from another one's snapshot (./snapshots.ts: memory.save is libvirt's save image). libvirt
 * restores a save image only as the domain that was saved: the domain XML it may be given with the image
 * (virDomainRestoreFlags' dxml, `virsh restore --xml`) is refused unless its name and uuid match the saved
 * ones ("Target domain name 'b' does not match source 'a'", then the same for the uuid), and the source domain
 * still exists under those. So the clone's identity is written into a copy of the image's header instead:
 * the XML there is what libvirt starts QEMU with before QEMU reads the memory that follows. Only what is not
 * the guest's hardware changes (name, uuid, owner metadata, file paths, MAC, tap); the devices and their
 * addresses stay as saved, since the saved device state must fit them.
 *
 * The header (libvirt's src/qemu/qemu_saveimage.h, version 2, written in host byte order): magic
 * "LibvirtQemudSave", then u32 version, data_len, was_running, compressed, cookieOffset and 15 unused; then
 * data_len bytes holding the XML (NUL-ended), the cookie from cookieOffset (NUL-ended) and zeros (libvirt
 * leaves 64 KiB of room so an edited XML may grow); QEMU's migration stream follows.
 */

const MAGIC = "LibvirtQemudSave";
const HEADER = 16 + 4 * 19;

interface SaveHeader {
  dataLen: number;
  compressed: number;
  xml: string;
  cookie: Buffer;
}

async function readHeader(path: string): Promise<SaveHeader> {
  const f = await open(path, "r");
  try {
    const head = Buffer.alloc(HEADER);
    await f.read(head, 0, HEADER, 0);
    const magic = head.subarray(0, 16).toString("latin1");
    if (magic !== MAGIC) throw new RuntimeError(`${path} is not a complete libvirt save image (magic ${JSON.stringify(magic)})`, false);
    const version = head.readUInt32LE(16);
    if (version !== 2) throw new RuntimeError(`${path}: libvirt save image version ${version} is not one this runtime can rewrite (2)`, false);
    const dataLen = head.readUInt32LE(20);
    const cookieOffset = head.readUInt32LE(32);
    const data = Buffer.alloc(dataLen);
    await f.read(data, 0, dataLen, HEADER);
    const xmlEnd = data.indexOf(0);
    if (xmlEnd < 0 || (cookieOffset !== 0 && cookieOffset <= xmlEnd)) throw new RuntimeError(`${path}: malformed save image header`, false);
    const cookieEnd = cookieOffset ? data.indexOf(0, cookieOffset) : -1;
    return {
      dataLen,
      compressed: head.readUInt32LE(28),
      xml: data.subarray(0, xmlEnd).toString("utf8"),
      cookie: cookieOffset && cookieEnd > 0 ? data.subarray(cookieOffset, cookieEnd + 1) : Buffer.alloc(0),
    };
  } finally {
    await f.close();
  }
}

/** The domain XML a save image restores. */
export const savedXml = async (path: string) => (await readHeader(path)).xml;

/**
 * `from` copied to `to` with `xml` in its header, marked saved-paused (was_running 0) so that restoring it
 * leaves the domain paused at the saved point whatever state the source was saved in.
 */
export async function writeCloneImage(from: string, to: string, xml: string): Promise<void> {
  const header = await readHeader(from);
  const text = Buffer.from(`${xml}\0`, "utf8");
  if (text.length + header.cookie.length > header.dataLen)
    throw new RuntimeError(`the clone's domain XML does not fit the save image header of ${from}`, false);
  await copyFile(from, to, constants.COPYFILE_FICLONE);
  const head = Buffer.alloc(HEADER);
  head.write(MAGIC, 0, "latin1");
  head.writeUInt32LE(2, 16);
  head.writeUInt32LE(header.dataLen, 20);
  head.writeUInt32LE(0, 24);
  head.writeUInt32LE(header.compressed, 28);
  head.writeUInt32LE(header.cookie.length ? text.length : 0, 32);
  const data = Buffer.alloc(header.dataLen);
  text.copy(data, 0);
  header.cookie.copy(data, text.length);
  const f = await open(to, "r+");
  try {
    // No fsync: the copy lives only until libvirt has read it back (from the page cache), and a crash before
    // that writes it again from the start. Flushing a guest's whole memory to disk would cost the restore more
    // than the rest of it together.
    await f.write(Buffer.concat([head, data]), 0, HEADER + header.dataLen, 0);
  } finally {
    await f.close();
  }
}

export interface CloneIdentity {
  /** The source instance's id: every occurrence (the name, the owner metadata, the per-instance file paths) becomes `id`. */
  fromId: string;
  id: string;
  uuid: string;
  mac: string;
  tap: string;
  /** The runtime that owns the clone (./domain-xml.ts's metadata). */
  owner: string;
}

/** The source's saved domain XML with the clone's identity; the hardware as saved. */
export function cloneXml(saved: string, c: CloneIdentity): string {
  const interfaces = saved.match(/<interface\b[\s\S]*?<\/interface>/g) ?? [];
  if (interfaces.length !== 1) throw new RuntimeError(`the saved domain has ${interfaces.length} network interfaces; a clone needs exactly one`, false);
  if (!/<uuid>[^<]*<\/uuid>/.test(saved)) throw new RuntimeError("the saved domain XML has no uuid", false);
  const nic = (interfaces[0] as string)
    .replace(/\s*<target dev=(['"])[^'"]*\1\s*\/>/, "")
    .replace(/<mac address=(['"])[^'"]*\1\s*\/>/, `<mac address='${esc(c.mac)}'/><target dev='${esc(c.tap)}'/>`);
  if (!nic.includes(`<target dev='${esc(c.tap)}'/>`)) throw new RuntimeError("the saved network interface has no MAC address", false);
  return saved
    .replace(interfaces[0] as string, nic)
    .replace(/<uuid>[^<]*<\/uuid>/, `<uuid>${c.uuid}</uuid>`)
    .replace(/(<\w+:instance\b[^>]*\bowner=)(['"])[^'"]*\2/, `$1'${esc(c.owner)}'`)
    .split(c.fromId)
    .join(c.id);
}
