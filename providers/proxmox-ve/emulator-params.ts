/**
 * The emulator's check of a config update: the keys it knows and PVE's formats for them (apidata's schema and
 * JSONSchema.pm's checks), answering 400 `Parameter verification failed.` with one message per bad key.
 */

export class PveFail extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly errors?: Record<string, string>,
  ) {
    super(message);
  }
}

export const paramFail = (errors: Record<string, string>) => new PveFail(400, "Parameter verification failed.", errors);

type Check = (v: string) => string | number | Error;

const bad = (message: string) => new Error(message);
const int =
  (min: number, max: number): Check =>
  (v) =>
    /^\d+$/.test(v) && Number(v) >= min && Number(v) <= max ? Number(v) : bad(`value must be an integer between ${min} and ${max}`);
const pattern =
  (re: RegExp, what = "value does not match the regex pattern"): Check =>
  (v) =>
    re.test(v) ? v : bad(what);

const ipv4Cidr = /^(\d{1,3}\.){3}\d{1,3}\/\d{1,2}$/;
const ipv4 = /^(\d{1,3}\.){3}\d{1,3}$/;
const sshKey = /^(ssh-(rsa|dss|ed25519)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com) [A-Za-z0-9+/]+=*( .*)?$/;

function ipconfig(v: string): string | Error {
  for (const part of v.split(",")) {
    const [k, val = ""] = part.split("=");
    const ok =
      (k === "ip" && (val === "dhcp" || ipv4Cidr.test(val))) ||
      (k === "gw" && ipv4.test(val)) ||
      (k === "ip6" && (val === "dhcp" || val === "auto" || /^[0-9a-f:]+\/\d+$/i.test(val))) ||
      (k === "gw6" && /^[0-9a-f:]+$/i.test(val));
    if (!ok) return bad(`invalid format - format error ${k}: invalid value '${val}'`);
  }
  return v;
}

/** `sshkeys` is URI-encoded: after the form is decoded it may hold only unreserved characters and `%`. */
function sshkeys(v: string): string | Error {
  if (!/^[-%a-zA-Z0-9_.!~*'()]*$/.test(v)) return bad("invalid urlencoded string");
  let text: string;
  try {
    text = decodeURIComponent(v);
  } catch {
    return bad("invalid urlencoded string");
  }
  for (const line of text.split("\n"))
    if (line.trim() && !sshKey.test(line.trim())) return bad(`invalid format - ssh key '${line.slice(0, 40)}' is not an OpenSSH public key`);
  return v;
}

/** PVE stores tags lower-cased, unique, sorted and `;`-joined, whatever separators it was given. */
function tags(v: string): string | Error {
  const list = v
    .toLowerCase()
    .split(/[;,\s]+/)
    .filter(Boolean);
  const wrong = list.find((t) => !/^[a-z0-9_][a-z0-9_\-+.]*$/.test(t));
  return wrong ? bad(`invalid format - invalid tag '${wrong}'`) : [...new Set(list)].sort().join(";");
}

const checks: Record<string, Check> = {
  cores: int(1, 8192),
  sockets: int(1, 4),
  memory: (v) => {
    const mib = /^(?:current=)?(\d+)$/.exec(v)?.[1];
    return mib && Number(mib) >= 16 ? v : bad("value must be at least 16 MiB");
  },
  name: pattern(/^(?=.{1,63}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$/, "invalid format - value does not look like a valid DNS name"),
  description: (v) => (v.length <= 8192 ? v : bad("value may only be 8192 characters long")),
  tags,
  ciuser: pattern(/^\S+$/),
  cipassword: (v) => v,
  citype: pattern(/^(nocloud|configdrive2|opennebula)$/),
  cicustom: pattern(/^((meta|network|user|vendor)=[^,]+)(,(meta|network|user|vendor)=[^,]+)*$/),
  sshkeys,
  nameserver: pattern(/^[0-9a-f.: ]+$/i),
  searchdomain: pattern(/^\S+$/),
  agent: pattern(/^(0|1|enabled=[01])(,.*)?$/),
  onboot: pattern(/^[01]$/),
  ipconfig0: ipconfig,
  net0: pattern(/^(virtio|e1000|rtl8139|vmxnet3)(=[0-9A-Fa-f:]{17})?(,[a-z_]+=[^,]+)*$/),
};

export function validateConfig(p: Record<string, string>): { set: Record<string, string | number>; remove: string[] } {
  const errors: Record<string, string> = {};
  const set: Record<string, string | number> = {};
  for (const [key, value] of Object.entries(p)) {
    if (key === "digest" || key === "delete") continue;
    const check = checks[key];
    const result = check ? check(value) : bad("property is not defined in schema and the schema does not allow additional properties");
    if (result instanceof Error) errors[key] = result.message;
    else set[key] = result;
  }
  const remove = (p.delete ?? "").split(/[,;\s]+/).filter(Boolean);
  for (const key of remove) if (!checks[key]) errors.delete = `invalid format - '${key}' is not a config key`;
  if (Object.keys(errors).length) throw paramFail(errors);
  return { set, remove };
}
