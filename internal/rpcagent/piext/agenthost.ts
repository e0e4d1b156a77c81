// agenthost's extension for pi: it makes a pi room keep the room's policy.
//
// agenthost writes this file into each pi room's own agent home at every start and loads it with
// -e (and nothing else: pi runs with --no-extensions, --no-skills, --no-prompt-templates and
// --no-themes, and reads no project folder). It reads the room file named by --agenthost-room=PATH
// and then
//   - gates tool calls by the room's approval mode: under always-ask every tool but the read-only
//     ones and the room's own asks through an RPC select dialog titled "Allow tool: NAME\nDETAIL"
//     with the options Approve and Deny (omp's), which agenthost turns into a durable approval;
//     anything but Approve, a dismissed dialog included, blocks the call;
//   - registers the room's tools (room_post, room_info and a program's), each call an RPC input
//     dialog titled TOOL_PREFIX + NAME with the arguments as JSON in its placeholder, answered by
//     agenthost with {"text"} or {"error"};
//   - registers ask, the room's questions (omp's schema), each question an RPC select (or input,
//     without options) dialog that agenthost turns into a durable room question.
// It fails closed: a missing or unreadable room file stops pi at start.
//
// Edit it in agenthost's source (internal/rpcagent/piext); the copy in a room's home is rewritten
// at every start.

import * as fs from "node:fs";

// The wire with agenthost; piext.go holds the same constants.
const FLAG = "agenthost-room";
const APPROVAL_PREFIX = "Allow tool: ";
const APPROVE = "Approve";
const DENY = "Deny";
const TOOL_PREFIX = "agenthost.tool:";
const YOLO = "yolo";

// Tools that only read (pi's read, grep, find, ls): never asked, as omp's always-ask does not.
const READ_ONLY = new Set(["read", "grep", "find", "ls"]);

// pi's own tools that change things: asked even if a room tool bears the name.
const BUILT_IN = new Set(["bash", "edit", "write"]);

interface RoomTool {
	name: string;
	description: string;
	parameters?: Record<string, unknown>;
}

interface Room {
	approval_mode: string;
	tools: RoomTool[];
}

// readRoom reads the room file pi was started with; it throws (and pi then refuses to start) when
// there is none. Flag values reach extensions only after they load, so it reads pi's arguments.
function readRoom(): Room {
	const prefix = `--${FLAG}=`;
	const arg = process.argv.find((a) => a.startsWith(prefix));
	if (!arg) {
		throw new Error(`agenthost: no --${FLAG}=PATH argument`);
	}
	const room = JSON.parse(fs.readFileSync(arg.slice(prefix.length), "utf-8")) as Room;
	if (typeof room.approval_mode !== "string" || !Array.isArray(room.tools)) {
		throw new Error("agenthost: malformed room file");
	}
	return room;
}

// MAX_DETAIL bounds what a dialog carries of a tool call (agenthost keeps 4 KiB of it).
const MAX_DETAIL = 16 * 1024;

// describe is what a person sees of a tool call, as omp shows it.
function describe(tool: string, input: Record<string, unknown>): string {
	const s = (v: unknown) => (typeof v === "string" ? v : JSON.stringify(v));
	let detail: string;
	switch (tool) {
		case "bash":
			detail = `Command: ${s(input.command)}`;
			break;
		case "write":
			detail = `Path: ${s(input.path)}\nContent:\n${s(input.content)}`;
			break;
		case "edit":
			detail = `File: ${s(input.path)}\nEdits: ${JSON.stringify(input.edits ?? [])}`;
			break;
		default:
			detail = JSON.stringify(input);
	}
	return detail.length > MAX_DETAIL ? `${detail.slice(0, MAX_DETAIL)}…` : detail;
}

// reserved reports whether a question's text could pass for one of agenthost's own dialogs.
function reserved(title: string): boolean {
	return title.startsWith(APPROVAL_PREFIX) || title.startsWith(TOOL_PREFIX);
}

const EMPTY_OBJECT = { type: "object", properties: {} };

const ASK_PARAMETERS = {
	type: "object",
	properties: {
		questions: {
			type: "array",
			minItems: 1,
			description: "The questions, asked one after another.",
			items: {
				type: "object",
				properties: {
					id: { type: "string", description: "A short id for the question." },
					question: { type: "string", description: "The question." },
					options: {
						type: "array",
						description: "The choices offered (people may still answer in their own words); none for a free answer.",
						items: {
							type: "object",
							properties: { label: { type: "string" }, description: { type: "string" } },
							required: ["label"],
						},
					},
				},
				required: ["question"],
			},
		},
	},
	required: ["questions"],
};

// The extension's factory; pi passes its ExtensionAPI.
export default function agenthost(pi: any) {
	const room = readRoom();
	const ask = room.approval_mode !== YOLO; // anything but yolo asks
	const own = new Set<string>(["ask"]);

	pi.registerFlag(FLAG, { type: "string", description: "agenthost's room file (set by agenthost)" });

	pi.on("tool_call", async (event: any, ctx: any) => {
		if (!ask || READ_ONLY.has(event.toolName) || own.has(event.toolName)) {
			return undefined;
		}
		if (!ctx.hasUI) {
			return { block: true, reason: `Tool call denied: nobody can approve ${event.toolName} here` };
		}
		const title = `${APPROVAL_PREFIX}${event.toolName}\n${describe(event.toolName, event.input ?? {})}`;
		const choice = await ctx.ui.select(title, [APPROVE, DENY], { signal: ctx.signal });
		if (choice === APPROVE) {
			return undefined;
		}
		return { block: true, reason: `Tool call denied by user: ${event.toolName}` };
	});

	for (const tool of room.tools) {
		if (!BUILT_IN.has(tool.name)) {
			own.add(tool.name);
		}
		pi.registerTool({
			name: tool.name,
			label: tool.name,
			description: tool.description,
			promptSnippet: tool.description,
			parameters: tool.parameters ?? EMPTY_OBJECT,
			async execute(_id: string, params: unknown, signal: AbortSignal | undefined, _update: unknown, ctx: any) {
				const reply = await ctx.ui.input(TOOL_PREFIX + tool.name, JSON.stringify(params ?? {}), { signal });
				if (reply === undefined) {
					throw new Error(`${tool.name}: the call was withdrawn before agenthost answered`);
				}
				const result = JSON.parse(reply) as { text?: string; error?: string };
				if (typeof result.error === "string") {
					throw new Error(result.error);
				}
				return { content: [{ type: "text", text: result.text ?? "" }], details: {} };
			},
		});
	}

	pi.registerTool({
		name: "ask",
		label: "Ask",
		description:
			"Ask the people in the conversation one or more questions and wait for their answers. Offer options when there are obvious choices.",
		promptSnippet: "Ask the people in the conversation a question and wait for the answer",
		parameters: ASK_PARAMETERS,
		async execute(_id: string, params: any, signal: AbortSignal | undefined, _update: unknown, ctx: any) {
			const answers: { id: string; answer: string }[] = [];
			for (const [i, q] of (params.questions ?? []).entries()) {
				const title = String(q.question ?? "");
				if (reserved(title)) {
					throw new Error("ask: a question may not start like agenthost's own dialogs");
				}
				const labels: string[] = (q.options ?? []).map((o: any) => String(o.label));
				const answer =
					labels.length > 0
						? await ctx.ui.select(title, labels, { signal })
						: await ctx.ui.input(title, undefined, { signal });
				if (answer === undefined) {
					throw new Error("ask: the question was withdrawn; nobody answered it");
				}
				answers.push({ id: String(q.id ?? i + 1), answer });
			}
			const text =
				answers.length === 1
					? `User answered: ${answers[0].answer}`
					: `User answers:\n${answers.map((a) => `${a.id}: ${a.answer}`).join("\n")}`;
			return { content: [{ type: "text", text }], details: { answers } };
		},
	});
}
