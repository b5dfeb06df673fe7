// The fake host's spawner: a small process of its own that starts its guests' confined commands and relays what
// they do over IPC (./spawner-client.ts). A fork copies its parent's page tables, so a spawn from the platform's
// own process (hundreds of MiB under `bc dev`) held its event loop for 15–50 ms each; from here it costs about a
// millisecond, and none of the platform's time. Plain JavaScript: it runs without the platform's loader.
import { spawn } from "node:child_process";

const children = new Map();
const send = (m) => process.connected && process.send(m);

process.on("message", (m) => {
  if (m.t === "spawn") return start(m);
  if (m.t === "destroy") for (const s of children.get(m.id)?.stdio.slice(1) ?? []) s?.destroy();
});
// The parent is gone: so are we, and with us (bubblewrap's --die-with-parent) every guest command.
process.on("disconnect", () => process.exit(0));

function start({ id, file, args, stdin }) {
  const child = spawn(file, args, {
    cwd: "/",
    env: {},
    // A session of its own: the whole group can be signalled (the parent signals it by pid).
    detached: true,
    stdio: [stdin === null ? "ignore" : "pipe", "pipe", "pipe", "pipe"],
  });
  child.once("error", (err) => {
    if (child.pid === undefined) send({ t: "error", id, code: err.code ?? null, message: err.message });
  });
  if (child.pid === undefined) return;
  children.set(id, child);
  send({ t: "spawn", id, pid: child.pid });
  if (child.stdin) {
    child.stdin.on("error", () => {});
    child.stdin.end(stdin);
  }
  for (const fd of [1, 2, 3]) {
    const stream = child.stdio[fd];
    // Decoded here, across chunk boundaries: a character split between two reads is never mangled.
    stream.setEncoding("utf8");
    stream.on("data", (data) => send({ t: "data", id, fd, data }));
    stream.on("error", () => {});
    stream.once("end", () => send({ t: "end", id, fd }));
  }
  child.once("exit", (code, signal) => send({ t: "exit", id, code, signal }));
  child.once("close", () => {
    children.delete(id);
    send({ t: "close", id });
  });
}
