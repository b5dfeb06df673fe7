import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { INSTANCE_COLUMNS } from "../../core/instances/model.ts";

// The plain-SQL path reads instances through INSTANCE_COLUMNS; a column missing there reads as undefined and
// silently breaks whatever decides on it (the reconciler once ignored every host report this way).
describe("INSTANCE_COLUMNS", () => {
  it("selects every column of the Instance model", () => {
    const schema = readFileSync("prisma/schema.prisma", "utf8");
    const model = /model Instance \{([\s\S]*?)\n\}/.exec(schema)?.[1] ?? "";
    const scalars = model
      .split("\n")
      .map((l) => l.trim())
      .filter((l) => /^[a-z][A-Za-z0-9]* +(String|Int|Boolean|DateTime|Json|Bytes|BigInt)/.test(l))
      .map((l) => l.split(/\s+/)[0] as string);
    expect(scalars.length).toBeGreaterThan(30);
    const selected = [...INSTANCE_COLUMNS.matchAll(/AS "([A-Za-z0-9]+)"|(?:^|,)\s*([a-z_0-9]+)(?=,|\s*$)/gm)].map((m) => m[1] ?? m[2]);
    for (const field of scalars) expect(selected, field).toContain(field);
  });
});
