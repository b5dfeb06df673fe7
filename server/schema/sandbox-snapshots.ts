import { SANDBOX_COLUMNS, type Sandbox as SandboxRow } from "../../core/sandboxes/sandboxes.ts";
import {
  createSandboxSnapshot,
  deleteSandboxSnapshot,
  getSandboxSnapshot,
  listSandboxSnapshots,
  type SandboxSnapshot as SnapshotRow,
} from "../../core/sandboxes/snapshots.ts";
import { mutate } from "../context.ts";
import { builder } from "./builder.ts";
import { Sandbox } from "./sandboxes.ts";
import { SnapshotState } from "./snapshots.ts";

/** Snapshots of sandboxes (memory and disk, on the host that runs them) and their lineage; restore with createSandbox(snapshotId). */

const SandboxSnapshot = builder.objectRef<SnapshotRow>("SandboxSnapshot").implement({
  fields: (t) => ({
    id: t.exposeID("id"),
    sandboxId: t.exposeID("sandboxId", { description: "The sandbox it was taken of." }),
    state: t.field({ type: SnapshotState, resolve: (s) => s.state }),
    sizeBytes: t.exposeFloat("sizeBytes", { nullable: true }),
    error: t.exposeString("error", { nullable: true }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    restoredInto: t.field({
      type: [Sandbox],
      description: "Sandboxes restored from it.",
      resolve: (s, _a, ctx) =>
        ctx.platform.read((sql) =>
          sql.query<SandboxRow>(`SELECT ${SANDBOX_COLUMNS} FROM sandboxes s WHERE s.from_snapshot_id = $1 ORDER BY s.created_at`, [s.id]),
        ),
    }),
  }),
});

const commandTimeout = (ms: number) => ({ timeoutMs: ms });

builder.queryFields((t) => ({
  sandboxSnapshot: t.withAuth({ operator: true, tenantScope: "compute:sandboxes:read" }).field({
    type: SandboxSnapshot,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => ctx.platform.read((sql) => getSandboxSnapshot(sql, ctx.principal, String(id))),
  }),
  sandboxSnapshots: t.withAuth({ operator: true, tenantScope: "compute:sandboxes:read" }).field({
    type: [SandboxSnapshot],
    args: { sandboxId: t.arg.id() },
    resolve: (_r, { sandboxId }, ctx) => ctx.platform.read((sql) => listSandboxSnapshots(sql, ctx.principal, sandboxId ? String(sandboxId) : null)),
  }),
}));

builder.mutationFields((t) => ({
  createSandboxSnapshot: t.withAuth({ tenantScope: "compute:sandboxes:write" }).field({
    type: SandboxSnapshot,
    description: "Save a running sandbox's memory and disk on its host (it keeps running); READY once the host is done.",
    args: { sandboxId: t.arg.id({ required: true }) },
    resolve: (_r, { sandboxId }, ctx, info) =>
      mutate(ctx, info, (w) => createSandboxSnapshot(w, ctx.principal, String(sandboxId), commandTimeout(ctx.platform.config.hosts.commandTimeoutMs))),
  }),
  deleteSandboxSnapshot: t.withAuth({ tenantScope: "compute:sandboxes:write" }).field({
    type: SandboxSnapshot,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx, info) => mutate(ctx, info, (w) => deleteSandboxSnapshot(w, ctx.principal, String(id))),
  }),
}));
