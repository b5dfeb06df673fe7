/**
 * How a VM says it is ours. The description is the label (free text, read back exactly); tags only narrow
 * searches, because PVE lower-cases them and allows few characters, and a clone cannot set them.
 */

const instanceLine = /^bc-instance: *(\S+) *$/m;
const managedByLine = /^bc-managed-by: *(.+?) *$/m;

export const managedTag = "bc-managed";

export function markerText(instanceId: string, managedBy: string): string {
  return `Made by better-compute; it deletes this VM with its instance.\nbc-instance: ${instanceId}\nbc-managed-by: ${oneLine(managedBy)}\n`;
}

export interface Marker {
  instanceId: string | null;
  managedBy: string | null;
}

export function readMarker(description: unknown): Marker {
  const text = typeof description === "string" ? description : "";
  return { instanceId: instanceLine.exec(text)?.[1] ?? null, managedBy: managedByLine.exec(text)?.[1] ?? null };
}

/** The instance's own tag: its id in the characters a PVE tag allows (a lossy key, confirmed by the description). */
export function instanceTag(instanceId: string): string {
  return `bc-${instanceId.toLowerCase().replace(/[^a-z0-9_\-+.]/g, "-")}`;
}

/** PVE's tag list as it stores it: `;`-joined, lower-cased, unique, sorted. Accepts any of its separators. */
export function splitTags(tags: unknown): string[] {
  return typeof tags === "string"
    ? tags
        .toLowerCase()
        .split(/[;,\s]+/)
        .filter(Boolean)
    : [];
}

export const joinTags = (tags: Iterable<string>): string => [...new Set(tags)].sort().join(";");

/**
 * PVE checks `sshkeys` against `[-%a-zA-Z0-9_.!~*'()]*` after the form is decoded, then URI-unescapes it: so
 * the keys are URI-encoded first (space as %20, never `+`), and the form body encodes that again.
 */
export const encodeSshKeys = (keys: readonly string[]): string => encodeURIComponent(keys.map(oneLine).join("\n"));

export function decodeSshKeys(value: unknown): string[] {
  if (typeof value !== "string" || value === "") return [];
  try {
    return decodeURIComponent(value).split("\n").filter(Boolean);
  } catch {
    return [];
  }
}

function oneLine(s: string): string {
  return s.replace(/[\r\n]+/g, " ").trim();
}
