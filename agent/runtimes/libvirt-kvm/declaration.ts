import { chmodSync, mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { z } from "zod";
import { AppError } from "../../../contracts/errors.ts";
import { bool, defineRuntime, integer, oneOf, path } from "../declaration.ts";
import { parseCidr } from "../fetch-guard.ts";
import { PASS_THROUGH_DIR } from "../files.ts";
import { createLibvirtRuntime, type LibvirtOptions } from "./index.ts";

const domainType = oneOf(["auto", "kvm", "qemu"]);
const libvirtUri = z.string().regex(/^[a-z][a-z0-9+.-]*:\/\/\S*$/i, { error: "expected a libvirt URI such as qemu:///system" });
const cidr = z.string().refine((s) => parseCidr(s) !== null, { error: "expected a CIDR such as 10.0.0.0/8 or fd00::/8, or an address" });
const gpu = z
  .string()
  .regex(/^[^=\s]+=[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$/, { error: "expected model=0000:65:00.0" })
  .transform((g) => {
    const [model, pciAddress] = g.split("=") as [string, string];
    return { model, pciAddress };
  });

/**
 * `bc agent --runtime libvirt-kvm`. Its flags: how to reach libvirt, the domain type (auto: kvm only with
 * hardware virtualisation), direct kernel boot for root-filesystem images, the shutdown bound, the GPUs offered
 * (model=0000:65:00.0, repeatable), and where images may come from: ranges a host may fetch from although they
 * are loopback, private or link-local (a mirror on the operator's network; repeatable), and whether plain http is
 * allowed (default: public https only). Flags win over the environment.
 */
export const libvirtKvm = defineRuntime({
  id: "libvirt-kvm",
  flags: {
    "libvirt-uri": { type: "string", schema: libvirtUri.optional() },
    "domain-type": { type: "string", schema: domainType.optional() },
    kernel: { type: "string", schema: path.optional() },
    initrd: { type: "string", schema: path.optional() },
    cmdline: { type: "string", schema: z.string().min(1, { error: "expected a kernel command line" }).optional() },
    "shutdown-timeout-ms": { type: "string", schema: integer(0).optional() },
    gpu: { type: "string", multiple: true, schema: z.array(gpu).default([]) },
    "image-source-allow": { type: "string", multiple: true, schema: z.array(cidr).optional() },
    "image-source-http": { type: "boolean", schema: z.boolean().optional() },
  },
  env: {
    LIBVIRT_DOMAIN_TYPE: domainType.optional(),
    LIBVIRT_URI: libvirtUri.optional(),
    /** Comma-separated, as --image-source-allow. */
    IMAGE_SOURCE_ALLOW: z
      .string()
      .transform((s) =>
        s
          .split(",")
          .map((c) => c.trim())
          .filter(Boolean),
      )
      .pipe(z.array(cidr))
      .optional(),
    IMAGE_SOURCE_HTTP: bool.optional(),
  },
  options: (f, env): { libvirt?: Omit<LibvirtOptions, "stateDir"> } => {
    if (!f.kernel) {
      for (const flag of ["initrd", "cmdline"] as const) if (f[flag] !== undefined) throw new AppError("INVALID_CONFIG", `--${flag}: only with --kernel`);
    }
    return {
      libvirt: {
        uri: f["libvirt-uri"] ?? env.LIBVIRT_URI,
        domainType: f["domain-type"] ?? env.LIBVIRT_DOMAIN_TYPE ?? "auto",
        boot: f.kernel
          ? { kernel: resolve(f.kernel), initrd: f.initrd ? resolve(f.initrd) : undefined, cmdline: f.cmdline ?? "console=ttyS0 root=/dev/vda rw" }
          : undefined,
        shutdownTimeoutMs: f["shutdown-timeout-ms"],
        gpus: f.gpu,
        imageSources: {
          allow: f["image-source-allow"] ?? env.IMAGE_SOURCE_ALLOW ?? [],
          allowHttp: f["image-source-http"] ?? env.IMAGE_SOURCE_HTTP ?? false,
        },
      },
    };
  },
  make: (o) => {
    // The agent's state dir holds the runtime's: QEMU's user must get through it (its own files stay private).
    mkdirSync(o.stateDir, { recursive: true });
    chmodSync(o.stateDir, PASS_THROUGH_DIR);
    return createLibvirtRuntime({ ...o.libvirt, stateDir: join(o.stateDir, "libvirt") });
  },
});
