/**
 * Unknown, expired or revoked tokens per source address. A token this server has not seen is read from the
 * database on every request (server/principal-cache.ts keeps only credentials that resolved), so a client
 * spraying made-up tokens costs a read each; past `limit` failures in a window, an address's tokens are refused
 * unread (RATE_LIMITED) until the window ends, while credentials it already proved keep working. Counted per
 * server, in memory: each server protects its own reads.
 */
export class AuthFailures {
  private readonly byAddress = new Map<string, { failures: number; until: number }>();
  /** Ended windows are dropped when the map has doubled since the last sweep. */
  private sweepAt = 4096;

  constructor(
    private readonly limit: number,
    private readonly windowMs: number,
  ) {}

  /** How long until `address` may present an unknown token again; 0 when it may now. */
  blockedFor(address: string, now = Date.now()): number {
    const w = this.byAddress.get(address);
    if (this.limit === 0 || !w || w.until <= now || w.failures < this.limit) return 0;
    return w.until - now;
  }

  failed(address: string, now = Date.now()): void {
    if (this.limit === 0) return;
    const w = this.byAddress.get(address);
    if (w && w.until > now) w.failures++;
    else this.byAddress.set(address, { failures: 1, until: now + this.windowMs });
    if (this.byAddress.size > this.sweepAt) {
      for (const [a, x] of this.byAddress) if (x.until <= now) this.byAddress.delete(a);
      this.sweepAt = Math.max(4096, 2 * this.byAddress.size);
    }
  }
}
