import { readFileSync } from "node:fs";
import { generate } from "@graphql-codegen/cli";
import { describe, expect, it } from "vitest";
import codegenConfig from "../../codegen.ts";
import { diffSql } from "../../infra/db/migration-tool.ts";
import { printedSchema } from "../../server/schema/index.ts";

// Generated artefacts are committed for clients; these fail when someone forgets to regenerate them.
describe("committed artefacts are current", () => {
  it("schema.graphql is the printed Pothos schema (run `npm run generate`)", () => {
    expect(readFileSync("schema.graphql", "utf8")).toBe(printedSchema());
  });

  it("sdk/generated.ts is what codegen makes of schema.graphql and sdk/operations (run `npm run generate`)", async () => {
    const files = (await generate({ ...codegenConfig, silent: true }, false)) as { filename: string; content: string }[];
    const sdk = files.find((f) => f.filename.endsWith("sdk/generated.ts"));
    expect(sdk).toBeDefined();
    expect(readFileSync("sdk/generated.ts", "utf8")).toBe(sdk?.content);
  });

  it("prisma/migrations hold every change of prisma/schema.prisma (run `bc migrate --create <name>`)", async () => {
    expect(await diffSql({ schemaPath: "prisma/schema.prisma", migrationsDir: "prisma/migrations" })).toBe("");
  });
});

describe("README", () => {
  it("quotes examples/walkthrough.ts exactly as it is (the embedded test runs that file)", () => {
    expect(readFileSync("README.md", "utf8")).toContain(readFileSync("examples/walkthrough.ts", "utf8"));
  });
});
