import type { ProviderDefinition } from "../core/pools/provider/contract.ts";
import { hetznerCloud } from "./hetzner-cloud/index.ts";
import { proxmoxVe } from "./proxmox-ve/index.ts";

/** The providers built in, which `PROVIDERS=hetzner-cloud,proxmox-ve` can name. One folder each. */
export const builtinProviders: readonly ProviderDefinition[] = [hetznerCloud, proxmoxVe];
