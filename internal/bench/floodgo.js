// Runs the Go flood agent ($FLOOD_AGENT bench flood-agent) on this
// process's own stdin and stdout. pi's RpcClient starts its agent as
// "node FILE", so every consumer starts the Go agent through this file and
// pays the same node start-up.
"use strict";
const { spawn } = require("node:child_process");
const child = spawn(process.env.FLOOD_AGENT, ["bench", "flood-agent"], { stdio: "inherit" });
process.on("SIGTERM", () => child.kill("SIGTERM"));
child.on("exit", (code) => process.exit(code ?? 1));
