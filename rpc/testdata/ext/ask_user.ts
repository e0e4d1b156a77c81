// Test extension for rpc/ui_real_test.go, loaded with `-e` by both omp
// (18.x) and pi (0.73.x). Their extension APIs agree on everything used here:
//
//   export default function (pi) { pi.registerTool({...}) }
//   execute(toolCallId, params, signal, onUpdate, ctx)
//   ctx.ui.select(title, options, opts?)  -> string | undefined
//   ctx.ui.confirm(title, message, opts?) -> boolean (false when cancelled)
//   ctx.ui.input(title, placeholder, opts?) -> string | undefined
//   ctx.ui.editor(title, prefill)         -> string | undefined
//   ctx.ui.notify(message, type), ctx.ui.setStatus(key, text | undefined)
//   ctx.hasUI (true in RPC mode for both, omp's plain rpc included)
//
// The parameter schema is plain JSON Schema, which both accept (pi wants
// TypeBox or JSON Schema, omp Zod, TypeBox or JSON Schema), so the file needs
// no imports. loadMode "essential" keeps omp from demoting the tool to
// "discoverable"; pi ignores the field.
//
// The tool ask_user runs one scenario and returns a one-line text naming
// every answer; a dialog that was cancelled shows as (cancelled).

const show = (v: unknown): string => (v === undefined ? "(cancelled)" : JSON.stringify(v));

export default function (pi: any) {
	pi.registerTool({
		name: "ask_user",
		label: "Ask user",
		description: "Asks the user questions through the host's dialogs.",
		loadMode: "essential",
		parameters: {
			type: "object",
			properties: {
				scenario: { type: "string", enum: ["all", "timed", "withdraw"] },
			},
			additionalProperties: false,
		},
		async execute(_id: string, params: { scenario?: string }, _signal: unknown, _onUpdate: unknown, ctx: any) {
			const ui = ctx.ui;
			let text: string;
			switch (params.scenario ?? "all") {
				case "timed": {
					// The agent resolves a timed dialog itself.
					const v = await ui.input("Timed question", "too slow", { timeout: 400 });
					text = `timed=${show(v)}`;
					break;
				}
				case "withdraw": {
					// The extension withdraws its own dialog (omp then sends a
					// cancel frame; pi just stops waiting).
					const ac = new AbortController();
					const timer = setTimeout(() => ac.abort(), 300);
					const v = await ui.input("Withdrawn question", "never answered", { signal: ac.signal });
					clearTimeout(timer);
					text = `withdrawn=${show(v)}`;
					break;
				}
				default: {
					ui.notify("asking the user", "info");
					ui.setStatus("ask_user", "asking");
					const sel = await ui.select("Pick a letter", ["a", "b", "c"]);
					const ok = await ui.confirm("Proceed?", "Really proceed with the plan?");
					const inp = await ui.input("Your name", "type a name");
					const ed = await ui.editor("Edit the note", "line one\nline two");
					ui.setStatus("ask_user", undefined);
					// hasUI tells extensions they may ask (they often check it).
					text = `hasUI=${ctx.hasUI} select=${show(sel)} confirm=${ok} input=${show(inp)} editor=${show(ed)}`;
				}
			}
			return { content: [{ type: "text", text }], details: {} };
		},
	});
}
