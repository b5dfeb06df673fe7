import { randomBytes } from "node:crypto";
import { AppError } from "../../../contracts/errors.ts";
import { sha256Hex } from "../../kernel/ids.ts";
import type { Write } from "../../kernel/write.ts";
import { requirePool } from "../pools.ts";
import { requireCapability } from "../registry.ts";

/**
 * How a host joins: an operator makes a single-use, short-lived join token for a pool; the host's agent trades
 * it once for a node of its own and a credential for that node. Only hashes of both are stored.
 */

export async function createJoinToken(w: Write, poolId: string, ttlSeconds: number) {
  requireCapability(await requirePool(w.sql, poolId), "hosts", "joining a host");
  const token = `bcj_${randomBytes(24).toString("base64url")}`;
  const expiresAt = new Date(w.now.getTime() + ttlSeconds * 1000);
  const id = w.ids("join");
  await w.sql.query(`INSERT INTO join_tokens (id, pool_id, token_hash, expires_at, created_at) VALUES ($1, $2, $3, $4, $5)`, [
    id,
    poolId,
    sha256Hex(token),
    expiresAt,
    w.now,
  ]);
  w.audit({ targetId: id, details: { poolId, expiresAt } });
  return { token, expiresAt, poolId };
}

/**
 * Trade a join token for a node and its credential. The token works once and only before it expires; the
 * node gets its capacity from the agent's first report.
 */
export async function joinNode(w: Write, token: string, name: string) {
  if (!/^[a-z0-9][a-z0-9.-]{0,62}$/.test(name)) throw new AppError("INVALID_INPUT", "node names are 1 to 63 lower-case letters, digits, . and -");
  const [jt] = await w.sql.query<{ id: string; pool_id: string }>(
    `UPDATE join_tokens SET used_at = $2 WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2 RETURNING id, pool_id`,
    [sha256Hex(token), w.now],
  );
  if (!jt) throw new AppError("UNAUTHENTICATED", "the join token is unknown, used or expired");
  const [taken] = await w.sql.query(`SELECT 1 FROM nodes WHERE pool_id = $1 AND name = $2`, [jt.pool_id, name]);
  if (taken) throw new AppError("CONFLICT", `a node named ${name} exists in this pool`);
  const nodeId = w.ids("node");
  const credential = `bcn_${randomBytes(32).toString("base64url")}`;
  await w.sql.query(`INSERT INTO nodes (id, pool_id, name, credential_hash, created_at) VALUES ($1, $2, $3, $4, $5)`, [
    nodeId,
    jt.pool_id,
    name,
    sha256Hex(credential),
    w.now,
  ]);
  await w.sql.query(`UPDATE join_tokens SET node_id = $2 WHERE id = $1`, [jt.id, nodeId]);
  w.audit({ targetId: nodeId, details: { poolId: jt.pool_id, joinToken: jt.id, name } });
  return { nodeId, credential, poolId: jt.pool_id };
}
