// GraphiQL's boot, served from this origin like everything else on the page (no inline script, no other host):
// its editor's workers come from here too, and the page is rendered once the bundle after this script has loaded.
const WORKERS = { editorWorkerService: "editor.worker.js", json: "json.worker.js", graphql: "graphql.worker.js" };
self.MonacoEnvironment = {
  globalAPI: false,
  getWorkerUrl: (_moduleId, label) => `/graphiql/${WORKERS[label] ?? WORKERS.editorWorkerService}`,
};
document.addEventListener("DOMContentLoaded", () => {
  const root = document.getElementById("root");
  globalThis.YogaGraphiQL.renderYogaGraphiQL(root, JSON.parse(root.dataset.options ?? "{}"));
});
