import { parseArgs } from "node:util";
import { createClient, DoctorDocument } from "../sdk/client.ts";
import { clientSettings } from "./config.ts";

/**
 * `bc doctor [--url U] [--token T] [--json]`: the doctor's findings, most severe first, each with its hint.
 * Exits 1 when any is an error, so a script or a health check can act on it.
 */
export async function doctorCommand(args: string[]): Promise<void> {
  const { values } = parseArgs({ args, options: { url: { type: "string" }, token: { type: "string" }, json: { type: "boolean", default: false } } });
  const client = createClient(clientSettings(values));
  const order = { ERROR: 0, WARNING: 1, INFO: 2 } as const;
  const findings = (await client.request(DoctorDocument)).doctor.toSorted((a, b) => order[a.severity] - order[b.severity] || a.id.localeCompare(b.id));
  if (values.json) process.stdout.write(`${JSON.stringify(findings, null, 2)}\n`);
  else if (!findings.length) process.stdout.write("no findings\n");
  else for (const f of findings) process.stdout.write(`${f.severity.padEnd(7)} ${f.id}  ${f.subject}\n        ${f.message}\n        fix: ${f.hint}\n`);
  if (findings.some((f) => f.severity === "ERROR")) process.exitCode = 1;
}
