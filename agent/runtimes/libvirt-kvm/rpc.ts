import { createConnection, type Socket } from "node:net";
import { RuntimeError } from "../runtime.ts";

/**
 * Just enough of libvirt's RPC protocol (XDR over libvirtd's unix socket) to send QEMU guest agent commands:
 * the Node binding has no agent API, virDomainQemuAgentCommand lives in libvirt-qemu.so which it does not
 * link, and a `virsh qemu-agent-command` process costs ~40 ms a call against ~1 ms here. The wire format is
 * what libvirt's own remote driver speaks to libvirtd (a client and a daemon of different versions interoperate
 * on it, so the procedures used here keep their numbers): src/rpc/virnetprotocol.x for the header,
 * src/remote/remote_protocol.x and qemu_protocol.x for the calls.
 */

const REMOTE_PROGRAM = 0x20008086;
const QEMU_PROGRAM = 0x20008087;
const PROC_CONNECT_OPEN = 1;
const PROC_DOMAIN_LOOKUP_BY_NAME = 23;
const PROC_AUTH_LIST = 66;
const QEMU_PROC_DOMAIN_AGENT_COMMAND = 3;
const TYPE_CALL = 0;
const TYPE_REPLY = 1;
const STATUS_OK = 0;
/** virErrorNumber VIR_ERR_NO_DOMAIN. */
const VIR_ERR_NO_DOMAIN = 42;
/** virnetprotocol.x's VIR_NET_MESSAGE_MAX: no reply is longer. */
const MESSAGE_MAX = 32 * 2 ** 20;

/** A libvirt error as the daemon sent it: its virErrorNumber and message. */
export class LibvirtCallError extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
    this.name = "LibvirtCallError";
  }
}

class Xdr {
  private readonly parts: Buffer[] = [];
  u32(n: number): this {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(n >>> 0);
    this.parts.push(b);
    return this;
  }
  i32(n: number): this {
    const b = Buffer.alloc(4);
    b.writeInt32BE(n);
    this.parts.push(b);
    return this;
  }
  string(s: string): this {
    const b = Buffer.from(s, "utf8");
    this.u32(b.length);
    this.parts.push(b, Buffer.alloc((4 - (b.length % 4)) % 4));
    return this;
  }
  opaque(b: Buffer): this {
    this.parts.push(b);
    return this;
  }
  bytes = () => Buffer.concat(this.parts);
}

class Reader {
  private at = 0;
  constructor(private readonly b: Buffer) {}
  u32 = () => this.take(4).readUInt32BE(0);
  i32 = () => this.take(4).readInt32BE(0);
  string(): string {
    const n = this.u32();
    const s = this.take(n).toString("utf8");
    this.take((4 - (n % 4)) % 4);
    return s;
  }
  optString = () => (this.u32() ? this.string() : null);
  take(n: number): Buffer {
    if (this.at + n > this.b.length) throw new RuntimeError("libvirt RPC: truncated reply", true);
    const out = this.b.subarray(this.at, this.at + n);
    this.at += n;
    return out;
  }
}

/** A domain as the protocol names it: the daemon finds it by uuid. */
interface DomainRef {
  name: string;
  uuid: Buffer;
  id: number;
}

const encodeDomain = (x: Xdr, d: DomainRef) => x.string(d.name).opaque(d.uuid).i32(d.id);

export class LibvirtRpc {
  private socket: Socket | null = null;
  private opening: Promise<void> | null = null;
  private serial = 1;
  private readonly pending = new Map<number, { resolve: (b: Buffer) => void; reject: (e: Error) => void }>();
  private inbox: Buffer = Buffer.alloc(0);
  /** Domains by name, as looked up: the daemon finds a domain by its uuid, which lasts as long as its definition. */
  private readonly domains = new Map<string, DomainRef>();

  constructor(private readonly path: string) {}

  /**
   * Run one guest agent command (a JSON string) in domain `name`; its JSON reply. `timeoutSec` is libvirt's
   * bound on the agent's answer (-2 blocks, -1 libvirt's default).
   */
  async agentCommand(name: string, command: string, timeoutSec: number): Promise<string> {
    await this.connect();
    const send = async (dom: DomainRef) =>
      this.call(QEMU_PROGRAM, QEMU_PROC_DOMAIN_AGENT_COMMAND, encodeDomain(new Xdr(), dom).string(command).i32(timeoutSec).u32(0).bytes());
    const known = this.domains.get(name);
    let reply: Buffer;
    try {
      reply = await send(known ?? (await this.lookup(name)));
    } catch (e) {
      // A domain removed and defined again under its name has a new uuid: look it up once more.
      if (!known || !(e instanceof LibvirtCallError) || e.code !== VIR_ERR_NO_DOMAIN) throw e;
      this.domains.delete(name);
      reply = await send(await this.lookup(name));
    }
    const result = new Reader(reply).optString();
    if (result === null) throw new LibvirtCallError(0, "the guest agent returned nothing");
    return result;
  }

  close(): void {
    this.socket?.destroy();
    this.socket = null;
  }

  private async lookup(name: string): Promise<DomainRef> {
    const r = new Reader(await this.call(REMOTE_PROGRAM, PROC_DOMAIN_LOOKUP_BY_NAME, new Xdr().string(name).bytes()));
    const dom = { name: r.string(), uuid: Buffer.from(r.take(16)), id: r.i32() };
    if (this.domains.size > 10_000) this.domains.clear();
    this.domains.set(name, dom);
    return dom;
  }

  private connect(): Promise<void> {
    if (this.socket) return Promise.resolve();
    this.opening ??= this.open().finally(() => {
      this.opening = null;
    });
    return this.opening;
  }

  private async open(): Promise<void> {
    const socket = createConnection(this.path);
    await new Promise<void>((resolve, reject) => {
      socket.once("connect", resolve);
      socket.once("error", (e) => reject(new RuntimeError(`libvirt RPC: cannot reach ${this.path}: ${e.message}`, true)));
    });
    socket.on("data", (d) => this.receive(d));
    const gone = (e?: Error) => {
      if (this.socket === socket) this.socket = null;
      for (const p of this.pending.values()) p.reject(new RuntimeError(`libvirt RPC: connection to libvirtd lost${e ? `: ${e.message}` : ""}`, true));
      this.pending.clear();
      this.inbox = Buffer.alloc(0);
    };
    socket.on("error", gone);
    socket.on("close", () => gone());
    this.socket = socket;
    try {
      // Auth first: for root on the local socket libvirtd answers "none" (it bypasses polkit for uid 0).
      const auth = new Reader(await this.call(REMOTE_PROGRAM, PROC_AUTH_LIST, Buffer.alloc(0)));
      const types = Array.from({ length: auth.u32() }, () => auth.i32());
      if (types.length > 0 && !types.includes(0))
        throw new RuntimeError(`libvirt RPC: ${this.path} wants authentication (${types.join(",")}); run as root`, false);
      await this.call(REMOTE_PROGRAM, PROC_CONNECT_OPEN, new Xdr().u32(1).string("qemu:///system").u32(0).bytes());
    } catch (e) {
      socket.destroy();
      throw e;
    }
  }

  private call(program: number, proc: number, payload: Buffer): Promise<Buffer> {
    const socket = this.socket;
    if (!socket) return Promise.reject(new RuntimeError("libvirt RPC: not connected", true));
    const serial = this.serial++;
    const header = new Xdr()
      .u32(24 + payload.length + 4)
      .u32(program)
      .u32(1)
      .i32(proc)
      .i32(TYPE_CALL)
      .u32(serial)
      .i32(STATUS_OK)
      .bytes();
    return new Promise((resolve, reject) => {
      this.pending.set(serial, { resolve, reject });
      socket.write(Buffer.concat([header, payload]));
    });
  }

  private receive(data: Buffer): void {
    this.inbox = this.inbox.length ? Buffer.concat([this.inbox, data]) : data;
    while (this.inbox.length >= 4) {
      const length = this.inbox.readUInt32BE(0);
      if (length < 28 || length > MESSAGE_MAX) {
        this.socket?.destroy(new Error(`bad message length ${length}`));
        return;
      }
      if (this.inbox.length < length) return;
      const message = this.inbox.subarray(4, length);
      this.inbox = this.inbox.subarray(length);
      const type = message.readInt32BE(12);
      const waiter = this.pending.get(message.readUInt32BE(16));
      // Anything but a reply to a call of ours (events, keepalives) is not asked for and not expected.
      if (type !== TYPE_REPLY || !waiter) continue;
      this.pending.delete(message.readUInt32BE(16));
      const body = Buffer.from(message.subarray(24));
      if (message.readInt32BE(20) === STATUS_OK) waiter.resolve(body);
      else {
        // remote_error: code, domain, message (optional string), …
        const r = new Reader(body);
        const code = r.i32();
        r.i32();
        waiter.reject(new LibvirtCallError(code, r.optString() ?? `libvirt error ${code}`));
      }
    }
  }
}
