// A small RPC agent that floods: on "prompt" it answers, then writes the
// frames in $FLOOD_FILE (message_update frames of about 1 KB, the shape omp
// streams, written by agenthost bench), a message_end and an agent_end, as
// fast as the pipe takes them. Reading the file is outside the timed part
// only in the sense that every client pays it alike. As it exits (stdin's
// end, or SIGTERM from pi's client) it writes its own CPU time to
// $FLOOD_CPU_FILE, so the bench can leave it out of the consumer's.
"use strict";
const fs = require("node:fs");
const flood = fs.readFileSync(process.env.FLOOD_FILE);
const tail = Buffer.from(
  JSON.stringify({ type: "message_end", message: { role: "assistant", content: [{ type: "text", text: "done" }], stopReason: "stop" } }) + "\n" +
  JSON.stringify({ type: "agent_end", messages: [] }) + "\n");

let buf = "";
process.stdin.on("data", (d) => {
  buf += d;
  let i;
  while ((i = buf.indexOf("\n")) >= 0) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    let cmd;
    try { cmd = JSON.parse(line); } catch { continue; }
    const reply = (data) => process.stdout.write(JSON.stringify({ id: cmd.id, type: "response", command: cmd.type, success: true, data }) + "\n");
    if (cmd.type === "prompt") {
      reply();
      process.stdout.write(JSON.stringify({ type: "agent_start" }) + "\n");
      process.stdout.write(flood);
      process.stdout.write(tail);
    } else if (cmd.type === "get_state") {
      reply({ isStreaming: false, sessionId: "flood", messageCount: 0, pendingMessageCount: 0 });
    } else {
      reply();
    }
  }
});
function exit() {
  if (process.env.FLOOD_CPU_FILE) fs.writeFileSync(process.env.FLOOD_CPU_FILE, JSON.stringify(process.cpuUsage()));
  process.exit(0);
}
process.stdin.on("end", exit);
process.on("SIGTERM", exit);
