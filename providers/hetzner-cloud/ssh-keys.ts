import { createHash } from "node:crypto";
import { z } from "zod";
import { ProviderError } from "../../core/pools/provider/contract.ts";
import { fail } from "./errors.ts";
import type { HcloudHttp } from "./http.ts";
import { MANAGED_BY_LABEL, sshKeySchema } from "./shapes.ts";

const keyList = z.object({ ssh_keys: z.array(sshKeySchema) });

interface KeyIdentity {
  publicKey: string;
  /** Ours, the same for the same key on every control plane, so registering twice finds the first. */
  name: string;
  /** Hetzner's MD5 fingerprint of the key blob, to find the key when someone registered it under another name. */
  fingerprint: string | null;
}

export function identify(key: string): KeyIdentity {
  const publicKey = key.trim();
  const [type, blob] = publicKey.split(/\s+/);
  const bytes = blob && /^[A-Za-z0-9+/]+={0,2}$/.test(blob) ? Buffer.from(blob, "base64") : null;
  // The comment is no part of a key's identity: hash the type and blob only.
  const digest = createHash("sha256")
    .update(bytes ? `${type} ${blob}` : publicKey)
    .digest("hex");
  const md5 = bytes ? createHash("md5").update(bytes).digest("hex") : null;
  return { publicKey, name: `bc-${digest.slice(0, 40)}`, fingerprint: md5 ? (md5.match(/../g) ?? []).join(":") : null };
}

/**
 * Hetzner takes the names or ids of registered keys, not key material: register each key once under a name
 * derived from it and answer the names to put on the server.
 */
export async function registerKeys(http: HcloudHttp, keys: readonly string[], managedBy: string): Promise<string[]> {
  const names = new Set<string>();
  for (const key of keys) {
    if (!key.trim()) continue;
    names.add(await registerKey(http, identify(key), managedBy));
  }
  return [...names];
}

async function registerKey(http: HcloudHttp, key: KeyIdentity, managedBy: string): Promise<string> {
  const byName = () => http.call("GET", "/ssh_keys", { query: [["name", key.name]], schema: keyList });
  if ((await byName()).ssh_keys.length > 0) return key.name;
  try {
    const body = { name: key.name, public_key: key.publicKey, labels: { [MANAGED_BY_LABEL]: managedBy } };
    await http.call("POST", "/ssh_keys", { body, schema: z.object({ ssh_key: sshKeySchema }) });
    return key.name;
  } catch (e) {
    if (!(e instanceof ProviderError && e.code === "uniqueness_error")) throw e;
  }
  // Lost a race with another worker, or the key is already there under a name someone else chose.
  if ((await byName()).ssh_keys.length > 0) return key.name;
  if (key.fingerprint) {
    const same = await http.call("GET", "/ssh_keys", { query: [["fingerprint", key.fingerprint]], schema: keyList });
    const found = same.ssh_keys[0];
    if (found) return found.name;
  }
  throw fail("transient", "POST /ssh_keys", "uniqueness_error (409): the key's name was taken but no key answers to it now", { code: "uniqueness_error" });
}
