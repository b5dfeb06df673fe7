// Builds the dashboard (web/) into web/dist, which the server serves at `/`. `npm start` and `npm run build`
// run it; the browser test runs it too. Vite is a development dependency: a production install takes the
// bundle from `npm run build`'s dist/ instead.
import { build } from "vite";

await build({ configFile: new URL("../web/vite.config.ts", import.meta.url).pathname, logLevel: "warn" });
