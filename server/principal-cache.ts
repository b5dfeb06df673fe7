import type { Principal } from "../core/auth/principal.ts";
import { sha256Hex } from "../core/kernel/ids.ts";
import type { Platform } from "../infra/platform.ts";

/**
 * The principals of credentials this server looked up lately, so that a busy client's every request is not also
 * a read of its token. A revocation (revokeToken, a tenant's teardown, a node declared gone) reaches every server
 * over the bus and drops the credential here before the next request; `ttlMs` bounds how long a missed message
 * (pub/sub down) could let a revoked credential through, and an expiry is checked on every hit. Only credentials
 * that resolved are kept: an unknown token is read every time, as any caller is limited, and cannot fill this.
 * A credential used past half its time here is read again shortly after the request that used it: a caller that keeps
 * coming never waits on that read (it cost the first request after each expiry a round trip or more), and one
 * that stops is forgotten at ttlMs as before.
 */
export class PrincipalCache {
  private readonly byHash = new Map<string, { principal: Principal; until: number }>();
  private revocations: (AsyncIterable<{ key: string }> & AsyncIterator<{ key: string }>) | undefined;
  /** Counts revocations heard: a lookup that one overtook may have read the row before it changed. */
  private revoked = 0;
  /** Hashes being read again behind their requests: one read at a time each. */
  private readonly refreshing = new Set<string>();

  private constructor(
    private readonly ttlMs: number,
    private readonly max: number,
  ) {}

  /** A cache that listens for revocations on the platform's bus until closed; ttlMs 0 keeps nothing. */
  static open(platform: Platform, ttlMs: number, max = 10_000): PrincipalCache {
    const cache = new PrincipalCache(ttlMs, max);
    if (ttlMs <= 0) return cache;
    const revocations = platform.bus.subscribe("credentialsRevoked");
    cache.revocations = revocations;
    void (async () => {
      for await (const { key } of revocations) cache.revoke(key);
    })().catch((e) => {
      // Without revocations the cache could only wait out its ttl: stop using it instead.
      platform.log.warn("principal cache lost its revocation subscription; reading every credential", { err: String(e) });
      cache.byHash.clear();
      cache.revocations = undefined;
    });
    return cache;
  }

  /** Whether `bearer` is remembered (and not expired): a request with it needs no read. */
  knows(bearer: string, now: Date): boolean {
    const hit = this.revocations ? this.byHash.get(sha256Hex(bearer)) : undefined;
    return !!hit && hit.until > Date.now() && !expired(hit.principal, now);
  }

  /** The principal for `bearer`, from memory or from `lookup` (kept when it resolved). */
  async principal(bearer: string, now: Date, lookup: () => Promise<Principal | null>): Promise<Principal | null> {
    if (!this.revocations) return lookup();
    const hash = sha256Hex(bearer);
    const hit = this.byHash.get(hash);
    if (hit && hit.until > Date.now() && !expired(hit.principal, now)) {
      if (hit.until - Date.now() < this.ttlMs / 2 && !this.refreshing.has(hash)) {
        this.refreshing.add(hash);
        // Once the request that found it has sent its own statements: sent at once, the read went to the
        // database ahead of them and held them up (seen: a pause's lock 2 ms later on a quiet server).
        setTimeout(() => void this.refresh(hash, lookup), REFRESH_AFTER_MS).unref();
      }
      return hit.principal;
    }
    if (hit) this.byHash.delete(hash);
    const before = this.revoked;
    const found = await lookup();
    // Only a credential that can be revoked by key (API tokens, node credentials): the operator's own token
    // costs no read anyway.
    if (found?.credential && this.revoked === before) {
      if (this.byHash.size >= this.max) this.byHash.delete(this.byHash.keys().next().value as string);
      this.byHash.set(hash, { principal: found, until: Date.now() + this.ttlMs });
    }
    return found;
  }

  /** Read a remembered credential again and keep what it says now, unless a revocation overtook the read. */
  private async refresh(hash: string, lookup: () => Promise<Principal | null>): Promise<void> {
    const before = this.revoked;
    try {
      const found = await lookup();
      if (this.revoked !== before || !this.revocations || !this.byHash.has(hash)) return;
      if (found?.credential) this.byHash.set(hash, { principal: found, until: Date.now() + this.ttlMs });
      else this.byHash.delete(hash);
    } catch {
      // Left to run out at its time: the first request after that reads it, and sees the failure itself.
    } finally {
      this.refreshing.delete(hash);
    }
  }

  revoke(key: string): void {
    this.revoked++;
    for (const [hash, { principal }] of this.byHash) if (principal.credential?.key === key) this.byHash.delete(hash);
  }

  async close(): Promise<void> {
    const r = this.revocations;
    this.revocations = undefined;
    this.byHash.clear();
    await r?.return?.();
  }
}

/** How long after the request that found a credential past half its time the read of it starts. */
const REFRESH_AFTER_MS = 50;

const expired = (p: Principal, now: Date) => !!p.credential?.expiresAt && p.credential.expiresAt <= now;
