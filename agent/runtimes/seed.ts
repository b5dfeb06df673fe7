import { createHash } from "node:crypto";
import type { InstanceSpec } from "../../contracts/host.ts";

export interface SeedFiles {
  "meta-data": string;
  "user-data": string;
  "network-config": string;
}

/**
 * The NoCloud seed every runtime burns (`genisoimage -volid cidata`): meta-data names the instance,
 * user-data carries the spec's keys and the caller's user data and nothing else (no token ever goes here).
 * With user data, a MIME multipart lets cloud-init apply our #cloud-config and the caller's part side by side,
 * whatever kind the caller's is; as text/plain, cloud-init sniffs it just as it would bare user data.
 */
export function renderSeed(spec: InstanceSpec): SeedFiles {
  // JSON strings are valid YAML scalars: a key or a hostname cannot break out of its line, whatever it holds.
  const scalar = (s: string) => (/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(s) ? s : JSON.stringify(s));
  const metaData = `instance-id: ${scalar(spec.id)}\nlocal-hostname: ${scalar(spec.hostname)}\n`;
  const keys = spec.sshKeys.map((k) => `  - ${JSON.stringify(k)}\n`).join("");
  const cloudConfig = `#cloud-config\nssh_authorized_keys:${keys ? `\n${keys}` : " []\n"}${envFiles(spec.env)}`;
  const network = networkConfig(spec);
  if (!spec.userData) return { "meta-data": metaData, "user-data": cloudConfig, "network-config": network };
  // Derived from the content, so it cannot occur inside it.
  const boundary = `==bc-${createHash("sha256").update(spec.userData).digest("hex").slice(0, 24)}==`;
  const part = (type: string, body: string) => `--${boundary}\nContent-Type: ${type}; charset="utf-8"\nMIME-Version: 1.0\n\n${body}\n`;
  const userData =
    `Content-Type: multipart/mixed; boundary="${boundary}"\nMIME-Version: 1.0\n\n` +
    part("text/cloud-config", cloudConfig) +
    part("text/plain", spec.userData) +
    `--${boundary}--\n`;
  return { "meta-data": metaData, "user-data": userData, "network-config": network };
}

/** Where the spec's env is exported for logins (every POSIX login shell reads /etc/profile.d/*.sh). */
export const ENV_PROFILE = "/etc/profile.d/bc-env.sh";

/**
 * The spec's env as a profile script, through cloud-init's write_files: a login sees the same variables that
 * exec gives a command. Names a shell cannot export are left out of the script (exec still passes them).
 * Single-quoted values: nothing in them is expanded, whatever they hold.
 */
export function envProfile(env: Record<string, string>): string {
  const lines = Object.entries(env)
    .filter(([k]) => /^[A-Za-z_][A-Za-z0-9_]*$/.test(k))
    .map(([k, v]) => `export ${k}='${v.replace(/'/g, "'\\''")}'\n`);
  return `# Written by the platform from the instance's env.\n${lines.join("")}`;
}

function envFiles(env: Record<string, string> | undefined): string {
  if (!env || Object.keys(env).length === 0) return "";
  // JSON strings are valid YAML scalars (see renderSeed).
  return `write_files:\n  - path: ${ENV_PROFILE}\n    permissions: "0644"\n    content: ${JSON.stringify(envProfile(env))}\n`;
}

/** The leased address on the NIC with the spec's MAC (netplan v2, which cloud-init reads); DHCP when none. */
function networkConfig(spec: InstanceSpec): string {
  const { mac, address, prefix, gateway } = spec.nic;
  const lines = ["version: 2", "ethernets:", "  nic0:", `    match: { macaddress: "${mac}" }`];
  if (address && prefix !== null) {
    lines.push(`    addresses: ["${address}/${prefix}"]`);
    if (gateway) lines.push(`    routes: [{ to: "0.0.0.0/0", via: "${gateway}" }]`);
  } else lines.push("    dhcp4: true");
  return `${lines.join("\n")}\n`;
}
