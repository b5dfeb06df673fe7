#!/usr/bin/env node
// The `bc` command. The platform is TypeScript run through tsx's loader: no build step between a checkout and
// a running control plane.
import { register } from "tsx/esm/api";

register();
globalThis[Symbol.for("bc.tsLoader")] = true;
await import("../cli/bc.ts");
