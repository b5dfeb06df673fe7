import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

// The dashboard: a static bundle the server serves at `/` (server/dashboard.ts). JSX comes from web/tsconfig.json.
export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  base: "/",
  logLevel: "warn",
  build: { outDir: "dist", emptyOutDir: true, target: "es2022", chunkSizeWarningLimit: 400 },
  // The SDK's Node transport (node:http) is never loaded in a browser, where it uses fetch: a stub keeps it out.
  resolve: { alias: [{ find: /^\.\/node-post\.ts$/, replacement: fileURLToPath(new URL("src/node-post-stub.ts", import.meta.url)) }] },
});
