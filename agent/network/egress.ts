import { execFile } from "node:child_process";
import type { NetworkPolicy } from "../../contracts/host.ts";
import { DEFAULT_TABLE, renderClear, renderRuleset, validateTableName, validateTapPrefix } from "./ruleset.ts";

/**
 * Host-side egress policy for sandbox guests, enforced with nftables on each instance's tap.
 *
 * Wiring: the libvirt runtime names each instance's tap `tapFor(instanceId)` (contracts/host.ts, prefix "bct"),
 * and the agent's converge pass (agent/converge.ts) calls `Egress.apply` with a map tap → the spec's `network` for
 * every instance whose policy the ruleset can hold (one it cannot is that instance's refusal). A tap that is not
 * in the map (the domain started before the next apply, or its policy refused) is dropped whole by a backstop
 * rule, so a guest is never unpoliced between "its tap appeared" and "we classified it".
 *
 * Design: "tag in the bridge, enforce in inet", chosen from what was measured on this kernel (tests/kvm/egress.test.ts).
 * Measured on this kernel: only the bridge family sees the tap's name (inet sees "br0"), and the bridge family has
 * no conntrack and no reject here. So:
 *   - table bridge <table>, prerouting: every frame from a `<prefix>*` port gets an skb mark 0x7e CC NNNN (class,
 *     tap number) from a map by tap name; no entry → mark 0 → dropped (the backstop). `all` is accepted, ARP
 *     passes for every class, `allowlist` IPv4/IPv6 goes on to inet, `none` keeps only DHCP (udp 68→67) and
 *     everything else (other ethertypes, VLAN-tagged frames) is dropped there and then.
 *   - table inet <table>, forward and input: marked packets go through guest_egress: replies on a connection the
 *     guest did not open pass (conntrack), `all` passes, `allowlist` jumps to its tap's chain of listed
 *     destinations, the rest is rejected (icmp admin-prohibited: a refused connect fails in milliseconds, not
 *     at the client's timeout). DHCP is accepted in input only, i.e. to the host, the guests' gateway.
 * Why B over A (bridge only, stateless): with A a `none`/`allowlist` guest cannot answer connections made to it
 * (its SYN-ACK is egress) and refused connects hang until timeout. Unlike the note's B, packets the guest
 * originates are re-checked even when established, so narrowing a policy cuts flows the new one does not allow.
 * Allowlists are rules in a per-tap chain (reached through a verdict map) rather than one concatenated interval
 * set, because the kernel's interval set refuses overlapping entries (10.0.0.0/8 and 10.1.0.0/16) that a policy
 * may legitimately hold.
 *
 * Needs: net.bridge.bridge-nf-call-iptables=1 (and -ip6tables) so bridged guest→guest traffic passes the inet
 * hooks; without it an allowlist guest reaches its bridge peers. `apply` sets both in the netns it works in
 * (the host's, or `netns`). The mark is the whole skb mark of frames from our taps; host rules that route by
 * fwmark must not expect their own marks on guest traffic. Anti-spoofing (a guest forging another's source
 * address) is not this module's job. Policies apply to taps that are bridge ports; a tap of ours reaching L3
 * without a bridge is dropped.
 *
 * Each change is one `nft -f -` transaction that deletes and re-creates our two tables (never another table),
 * so a guest never sees a half-applied policy. `apply` skips nft when the rendered script is the one it last
 * loaded (a table flushed behind our back is not noticed until the next change, or `clear`).
 */

export { renderClear, renderRuleset } from "./ruleset.ts";

/** tapFor(instanceId) names begin with this. */
export const DEFAULT_TAP_PREFIX = "bct";

const SYSCTLS = ["/proc/sys/net/bridge/bridge-nf-call-iptables", "/proc/sys/net/bridge/bridge-nf-call-ip6tables"];
const NETNS_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

export interface EgressOptions {
  /** The nft binary; default "nft" (looked up in PATH). */
  nft?: string;
  tapPrefix?: string;
  table?: string;
  /** Work inside `ip netns exec NAME` (tests build their own host in a namespace). */
  netns?: string;
}

interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
  missing: boolean;
}

function runWith(netns: string | undefined, cmd: string, args: string[], stdin?: string): Promise<RunResult> {
  const [file, argv] = netns ? ["ip", ["netns", "exec", netns, cmd, ...args]] : [cmd, args];
  return new Promise((resolve) => {
    const child = execFile(file, argv, { timeout: 60_000, maxBuffer: 16 * 2 ** 20 }, (err, stdout, stderr) => {
      const e = err as (NodeJS.ErrnoException & { code?: unknown }) | null;
      resolve({
        code: e ? (typeof e.code === "number" ? e.code : null) : 0,
        stdout: String(stdout),
        stderr: String(stderr) || (e?.message ?? ""),
        missing: e?.code === "ENOENT",
      });
    });
    // A child that dies before reading its stdin (a missing binary) must not turn into an unhandled EPIPE.
    child.stdin?.on("error", () => {});
    child.stdin?.end(stdin ?? "");
  });
}

export class Egress {
  private readonly nft: string;
  private readonly tapPrefix: string;
  private readonly table: string;
  private readonly netns: string | undefined;
  /** The script nft last loaded successfully; null when unknown (start, failure, clear). */
  private loaded: string | null = null;
  /** Applies and clears run one at a time, so `loaded` always describes what the kernel has. */
  private queue: Promise<unknown> = Promise.resolve();

  constructor(opts: EgressOptions = {}) {
    this.nft = opts.nft ?? "nft";
    this.tapPrefix = validateTapPrefix(opts.tapPrefix ?? DEFAULT_TAP_PREFIX);
    this.table = validateTableName(opts.table ?? DEFAULT_TABLE);
    if (opts.netns !== undefined && !NETNS_NAME.test(opts.netns)) throw new Error(`egress: bad netns name ${JSON.stringify(opts.netns)}`);
    this.netns = opts.netns;
  }

  /** Make the tap → policy map the whole truth: taps it does not name are dropped, other interfaces untouched. */
  apply(policies: ReadonlyMap<string, NetworkPolicy>): Promise<void> {
    // Render (and so validate) at once, in the caller's turn: a bad policy throws before anything runs.
    let script: string;
    try {
      script = renderRuleset(policies, { tapPrefix: this.tapPrefix, table: this.table });
    } catch (e) {
      return Promise.reject(e);
    }
    return this.serially(async () => {
      if (script === this.loaded) return;
      // A sysctl we cannot set does not stop the load: such a host still gets the backstop and routed-egress policy.
      const sysctl = await this.bridgeCallsInet();
      await this.load(script);
      if (sysctl) {
        this.loaded = null; // try again next time
        throw new Error(`egress: rules loaded, but bridged guest-to-guest traffic is not policed: ${sysctl}`);
      }
    });
  }

  /** Remove our tables (only ours); a later apply loads its ruleset whatever it was before. */
  clear(): Promise<void> {
    return this.serially(() => this.load(renderClear(this.table), true));
  }

  /**
   * Whether this host can enforce policies: nft runs, we may use netlink, and the kernel accepts every construct
   * the ruleset uses (bridge mark map, conntrack, reject, verdict maps). Checked with `nft -c`, which changes nothing.
   */
  static async available(opts: { nft?: string; netns?: string } = {}): Promise<boolean> {
    const sample = new Map<string, NetworkPolicy>([
      ["bct0", { egress: "none", allow: [] }],
      [
        "bct1",
        {
          egress: "allowlist",
          allow: [
            { cidr: "10.0.0.0/8", port: 80, proto: "tcp" },
            { cidr: "fd00::/8", port: null, proto: "udp" },
          ],
        },
      ],
      ["bct2", { egress: "all", allow: [] }],
    ]);
    const script = renderRuleset(sample, { tapPrefix: DEFAULT_TAP_PREFIX, table: "bc_egress_probe" });
    const r = await runWith(opts.netns, opts.nft ?? "nft", ["-c", "-f", "-"], script);
    return r.code === 0;
  }

  private serially<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.queue.then(fn, fn);
    this.queue = next.catch(() => {});
    return next;
  }

  private async load(script: string, clearing = false): Promise<void> {
    this.loaded = null;
    const r = await runWith(this.netns, this.nft, ["-f", "-"], script);
    if (r.missing) throw new Error(`egress: ${this.netns ? "ip" : this.nft} not found (the host needs nftables${this.netns ? " and iproute2" : ""})`);
    if (r.code !== 0) throw new Error(`egress: nft -f failed: ${r.stderr.trim()}`);
    if (!clearing) this.loaded = script;
  }

  /** Set bridge-nf-call-ip(6)tables to 1 where it is not; the problem as text, or null when both are 1. */
  private async bridgeCallsInet(): Promise<string | null> {
    for (const path of SYSCTLS) {
      const now = await runWith(this.netns, "cat", [path]);
      if (now.code !== 0) return `cannot read ${path} (is br_netfilter loaded?): ${now.stderr.trim()}`;
      if (now.stdout.trim() === "1") continue;
      const set = await runWith(this.netns, "tee", [path], "1\n");
      if (set.code !== 0) return `cannot set ${path} to 1: ${set.stderr.trim()}`;
    }
    return null;
  }
}
