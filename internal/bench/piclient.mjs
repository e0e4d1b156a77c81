// Drives pi's own TypeScript RpcClient against the flood agent and counts
// message_update events. Usage: node piclient.mjs <rpc-client.js> <flood.js>
// (FLOOD_FILE in the environment names the frames).
const [clientPath, floodPath] = process.argv.slice(2);
const { RpcClient } = await import(clientPath);
const client = new RpcClient({ cliPath: floodPath });
let updates = 0;
client.onEvent((e) => { if (e.type === "message_update") updates++; });
await client.start();
const idle = client.waitForIdle(600000);
await client.prompt("go");
await idle;
await client.stop();
console.log(JSON.stringify({ updates }));
