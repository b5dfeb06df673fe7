import { type Image as ImageRow, listImages, registerImage } from "../../core/catalog/images.ts";
import { mutate } from "../context.ts";
import { builder } from "./builder.ts";

const ImageFormat = builder.enumType("ImageFormat", { values: { RAW: { value: "raw" }, QCOW2: { value: "qcow2" }, ISO: { value: "iso" } } as const });

const Image = builder.objectRef<ImageRow>("Image").implement({
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    source: t.exposeString("source", { description: "Where hosts download it from." }),
    sha256: t.exposeString("sha256", { description: "Hosts refuse a download whose digest differs." }),
    format: t.field({ type: ImageFormat, resolve: (i) => i.format }),
    verified: t.exposeBoolean("verified", { description: "Vouched for by the operator; instances carry it as imageVerified." }),
    public: t.boolean({ resolve: (i) => i.visibility === "public" }),
    tenantId: t.exposeID("tenantId", { nullable: true, description: "The owner; null for the operator's images." }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

const RegisterImageInput = builder.inputType("RegisterImageInput", {
  fields: (t) => ({
    name: t.string({ required: true }),
    source: t.string({ required: true, description: "An http(s) URL." }),
    sha256: t.string({ required: true }),
    format: t.field({ type: ImageFormat, required: true }),
    public: t.boolean({ description: "Operators only: every tenant can boot it." }),
    verified: t.boolean({ description: "Operators only; defaults to true for their images." }),
  }),
});

builder.queryField("images", (t) =>
  t.withAuth({ operator: true, tenantScope: "compute:images:read" }).field({
    type: [Image],
    description: "The images the caller can boot: its tenant's and the public ones (operators: all).",
    resolve: (_r, _a, ctx) => ctx.platform.read((sql) => listImages(sql, ctx.principal)),
  }),
);

builder.mutationField("registerImage", (t) =>
  t.withAuth({ operator: true, tenantScope: "compute:images:write" }).field({
    type: Image,
    args: { input: t.arg({ type: RegisterImageInput, required: true }) },
    resolve: (_r, { input }, ctx, info) => {
      const p = ctx.principal;
      const sources = ctx.platform.config.vps.imageSources;
      return mutate(ctx, info, (w) => registerImage(w, p, { ...input, public: input.public ?? undefined, verified: input.verified ?? undefined }, sources));
    },
  }),
);
