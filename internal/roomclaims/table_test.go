package roomclaims

import (
	"encoding/json"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/rpcagent/piext"
)

// The table: what a room promises (claims), and the real agent paths that must keep the promises
// (paths). Each path either runs a claim or names its gap with the reason; the support matrix is
// rendered from this data, so it says exactly what the test run proves.

// claim is one named promise of a room.
type claim struct {
	id, title string
	// how says, per transport ("rpc", "acp"), how the promise is kept; a path may say more.
	how map[string]string
	run func(r *pathRun)
}

// path is one real agent on one transport.
type path struct {
	id        string // column name in the matrix
	transport string // "rpc" or "acp"
	kind      agents.Kind
	// shell returns the script directive that makes the agent run cmd in its shell tool (one
	// that asks permission when the room asks).
	shell func(cmd string) string
	// mcpName is the name the model calls an MCP server's tool by (the room's tools come over ACP
	// as the MCP server "agenthost").
	mcpName func(server, tool string) string
	// ask is the script directive that makes the agent ask "Which color?" (red or blue).
	ask string
	// model and modelSeen: a model the room selects and the name the model server then sees.
	model, modelSeen string
	// how adds, per claim, what is particular to this path.
	how map[string]string
	// instead says, per claim, how this path keeps it in place of its transport's way.
	instead map[string]string
	// gaps are the claims this path does not keep, with the reason (a measured fact).
	gaps map[string]string
}

// Claim ids, in matrix order.
const (
	cReply      = "reply"
	cStreaming  = "streaming"
	cRoomTools  = "room-tools"
	cToolsAsked = "room-tools-asked"
	cAllow      = "approval-allow"
	cDeny       = "approval-deny"
	cDeadline   = "approval-deadline"
	cConfig     = "workspace-config"
	cWorkspace  = "workspace"
	cConfined   = "confinement"
	cMCP        = "mcp"
	cMultiTurn  = "multi-turn"
	cUsage      = "usage"
	cResume     = "resume"
	cCancel     = "cancel"
	cBackground = "background"
	cQuestions  = "questions"
	cModel      = "model"
	cCleanup    = "cleanup"
	cPooled     = "pooled"
)

// acpNoPool is the pooled gap of the ACP paths the pool does not serve.
const acpNoPool = "the ACP transport's warm pool serves codex and copilot only: this agent's rooms start cold"

// acpPooled is how the ACP paths the pool serves hold the pooled claim.
const acpPooled = "new rooms only: the slot's workspace, home and TMPDIR (its Landlock rules; its agent initialized) renamed into the room's place, " +
	"then `session/new` with the room's workspace and the room tools' MCP server (listening from the agent's start, given the room's tools at the bind); " +
	"a woken room starts cold (`agenthost_pool_misses_total{reason=\"resume\"}`: an ACP agent loads a session from the home it was started with) " +
	"and resumes its session, found under the slot's home's name (a link to the room's home while its agent runs)"

var claims = []claim{
	{cReply, "Replies: a message gets the agent's answer as the turn's text", map[string]string{
		"rpc": "`prompt`, text from `agent_end`",
		"acp": "`session/prompt`, text from `agent_message_chunk` updates",
	}, claimReply},
	{cStreaming, "Streaming: the answer arrives as `text.delta` events before the turn ends", map[string]string{
		"rpc": "`message_update` text deltas",
		"acp": "`agent_message_chunk` updates",
	}, claimStreaming},
	{cRoomTools, "Room tools: the agent calls the room's tools (`room_post`, `room_info`, host tools)", map[string]string{
		"rpc": "omp host tools over RPC",
		"acp": "a per-agent MCP server `agenthost` (streamable HTTP on loopback, bearer token) in `session/new`",
	}, claimRoomTools},
	{cToolsAsked, "Room tools ask: under `always-ask` a call of a room tool waits for a person, who sees its arguments; denied, it does nothing", map[string]string{
		"rpc": "the room asks when the host runs the tool (omp's own prompt for a host tool, which shows no arguments, is answered for it; pi's extension asks nothing itself)",
		"acp": "the room asks when its MCP server `agenthost` runs the tool",
	}, claimRoomToolsAsked},
	{cAllow, "Approvals, allow: a tool call waits for a person's allow, then runs", map[string]string{
		"rpc": "omp `--approval-mode always-ask` select dialog → durable approval",
		"acp": "`session/request_permission` → durable approval → `allow_once`",
	}, claimAllow},
	{cDeny, "Approvals, deny: a denied tool call does not run, and the turn settles", map[string]string{
		"rpc": "`Deny` answer; omp reports the denial to the model",
		"acp": "`reject_once`",
	}, claimDeny},
	{cDeadline, "Approvals, deadline: an approval nobody answers is denied at its deadline, never allowed", map[string]string{
		"rpc": "the room answers `Deny` at the deadline",
		"acp": "the room answers `reject_once` at the deadline",
	}, claimDeadline},
	{cConfig, "Workspace config: a workspace carrying the agent's own project config still asks: its approval mode, " +
		"permissions and hooks neither loosen the room's approvals nor run anything unasked", map[string]string{
		"rpc": "`--approval-mode` on the command line (over every settings layer), a `--config` overlay (the workspace's MCP files, " +
			"per-tool policies, language servers and every discovery provider that loads modules, plugins or settings off), " +
			"`--no-extensions` (its extension and hook modules), no `bunfig.toml` or `.env` read from the workspace; what runs marks " +
			"the room's workspace, where an allowed control command's mark is seen",
		"acp": "each recipe pins the room's approval mode and keeps the agent to its throwaway home's configuration; what runs marks " +
			"the room's workspace, where an allowed control command's mark is seen",
	}, claimWorkspaceConfig},
	{cWorkspace, "Workspace: the agent's tools run in the room's own workspace, apart from its home", map[string]string{
		"rpc": "the agent's cwd is the workspace, its home a separate folder",
		"acp": "`session/new` cwd is the workspace; `fs/*` requests confined to it",
	}, claimWorkspace},
	{cConfined, "Confinement: the agent and everything it starts reach only the room's own workspace, home and TMPDIR, the system read-only, " +
		"and the ports allowed (Landlock), and hold no privilege: no capability, `no_new_privs`, a seccomp filter. The same launcher confines a " +
		"custom agent (`serve -- COMMAND`) and agents under `serve --daemon`. A server run as root runs each room's agent as a uid of the " +
		"room's own (`--agent-uids`), in a view of only its folders, a `/proc` of only its processes and an IPC namespace of its own; a " +
		"server not run as root runs agents as its own user, where chmod and utime of the server's own files by path stay open to them " +
		"(README, Confinement)", map[string]string{
		"rpc": "agenthost's launcher drops every capability, sets `no_new_privs`, restricts itself with Landlock (files, TCP connect and bind, signals and abstract sockets) and a seccomp filter, then executes the agent; a denial is the tool's error and the turn settles",
		"acp": "agenthost's launcher drops every capability, sets `no_new_privs`, restricts itself with Landlock (files, TCP connect and bind, signals and abstract sockets) and a seccomp filter, then executes the agent; a denial is the tool's error and the turn settles",
	}, claimConfinement},
	{cMCP, "Room-scoped MCP: the room's MCP servers, and only those, reach the agent", map[string]string{
		"rpc": "written into the room's own agent home (omp: its Windsurf MCP file, the one user source the overlay opts in), project files ignored",
		"acp": "`mcpServers` of `session/new` (stdio)",
	}, claimMCP},
	{cMultiTurn, "Multi-turn: the next message is answered in the same session, with the earlier turns", map[string]string{
		"rpc": "one agent process and session per room",
		"acp": "one agent process and session per room",
	}, claimMultiTurn},
	{cUsage, "Usage: `turn.ended` carries the turn's tokens as the agent reported them (exactly the model's counts) and its cost: " +
		"at the price registered for the model, the agent's own, or 0 where the agent reports none", map[string]string{
		"rpc": "the `usage` of each assistant message's `message_end`, summed; cost at the price agenthost registers for the model",
		"acp": "the `usage` of the `session/prompt` answer (tokens); the cost from `usage_update` notifications (a session total, differenced per turn)",
	}, claimUsage},
	{cResume, "Resume after a process restart: a new host resumes the room's session", map[string]string{
		"rpc": "`--resume` of the room's session file",
		"acp": "`session/load` (strict: a refused load is an error)",
	}, claimResume},
	{cCancel, "Cancellation: a running turn is cancelled, and the next one runs", map[string]string{
		"rpc": "`abort`, after denying the turn's pending approvals",
		"acp": "`session/cancel`, bounded (5 s)",
	}, claimCancel},
	{cBackground, "Background work: a turn that leaves a background process settles; the process is the room's", map[string]string{
		"rpc": "the turn ends at `agent_end`; the process stays in the agent's custody scope",
		"acp": "the turn ends at the `session/prompt` answer; the process stays in the agent's custody scope",
	}, claimBackground},
	{cQuestions, "Questions: the agent's questions become durable room questions", map[string]string{
		"rpc": "omp's `ask` tool (rpc-ui dialogs) → `question.asked`, answered by API or the next message",
		"acp": "an elicitation form (omp's `ask` tool) → `question.asked`, answered by API",
	}, claimQuestions},
	{cModel, "Model selection: the room's model is used, and an unknown one fails the turn", map[string]string{
		"rpc": "`--model`, checked with `get_state`",
		"acp": "`session/set_model` from the session's model list, else the `model` session config option",
	}, claimModel},
	{cCleanup, "Cleanup: after a room's release nothing of its agent's process tree remains, and the receipt says so", map[string]string{
		"rpc": "stdin EOF, then custody (process group, subreaper, marker sweep); receipt in `agent.released`",
		"acp": "stdin EOF, then custody (process group, subreaper, marker sweep); receipt in `agent.released`",
	}, claimCleanup},
	{cPooled, "Pooled: with `serve --pool`, a new room is bound to an agent started ahead of it (`agent.started` `pooled`), confined alike, " +
		"whose tools run in the room's workspace; a room woken after a release resumes its session, bound to a pool agent too where the path says so", map[string]string{
		"rpc": "new and woken rooms: a slot's workspace, home and TMPDIR (its Landlock rules) renamed into the room's place after the room's files are moved into them (journaled); " +
			"then `switch_session` to the room's session file (a new one: a header naming the workspace)",
		"acp": acpPooled,
	}, claimPooled},
}

// shellCmd builds a tool directive with cmd under key and the extra fields.
func shellCmd(tool, key string, extra map[string]any) func(string) string {
	return func(cmd string) string {
		args := map[string]any{key: cmd}
		for k, v := range extra {
			args[k] = v
		}
		b, _ := json.Marshal(args)
		return "[[tool:" + tool + " " + string(b) + "]]"
	}
}

// The question tools.
const (
	ompAsk    = `[[tool:ask {"questions":[{"id":"c","question":"Which color?","options":[{"label":"red"},{"label":"blue"}]}]}]]`
	claudeAsk = `[[tool:AskUserQuestion {"questions":[{"question":"Which color?","header":"Color","multiSelect":false,"options":[{"label":"red","description":"red"},{"label":"blue","description":"blue"}]}]}]]`
	codexAsk  = `[[tool:request_user_input {"questions":[{"id":"c","header":"Color","question":"Which color?","options":[{"label":"red","description":"red"},{"label":"blue","description":"blue"}]}]}]]`
)

// piGaps are the gaps of pi rooms as piext names them (serve --agent pi prints them at start).
func piGaps() map[string]string {
	gaps := map[string]string{}
	for _, g := range piext.Gaps() {
		gaps[g.Claim] = g.Reason
	}
	return gaps
}

// MCP tool names as each agent shows them to the model.
func ompMCP(server, tool string) string    { return "mcp__" + server + "_" + tool }
func doubleMCP(server, tool string) string { return "mcp__" + server + "__" + tool }
func dashMCP(server, tool string) string   { return server + "-" + tool }

var paths = []path{
	{
		id: "omp rpc", transport: "rpc", kind: agents.OMP,
		shell:   shellCmd("bash", "command", nil),
		mcpName: ompMCP,
		ask:     ompAsk,
		model:   agents.ModelID, modelSeen: "fake-model",
		how: map[string]string{
			cConfig: "tested with `.omp/config.yml` and `.omp/settings.json` (`approvalMode: yolo`, `bash`/`write` allowed), extension, " +
				"hook and `.omp`/`.claude`/`.codex` tool modules, a `bunfig.toml` preload and a `.env` moving omp's data folder to a " +
				"plugin in the workspace; omp's own provider is off (the room's MCP servers come from the home's Windsurf MCP file, " +
				"the one user source that loads no code); a workspace with `.omp/plugins` (loaded whatever the settings say) is refused: " +
				"the turn fails naming it",
			cPooled: "omp's `switch_session` refuses another cwd: `/move` to the workspace first (the overlay and flags of its start hold after it)",
		},
	},
	{
		id: "pi rpc", transport: "rpc", kind: agents.Pi,
		shell: shellCmd("bash", "command", nil),
		ask:   ompAsk,
		model: agents.ModelID, modelSeen: "fake-model",
		instead: map[string]string{
			cRoomTools: "agenthost's pi extension registers the room's tools; each call is an RPC `input` dialog the room answers",
			cAllow: "agenthost's pi extension asks for every tool but read, grep, find and ls (always-ask) with omp's select dialog → durable approval; " +
				"pi loads no extension, setting, skill or prompt of the workspace",
			cDeny:      "`Deny` answer; the extension blocks the call and pi reports the denial to the model",
			cResume:    "`--session` of the room's session file (a torn last line repaired first)",
			cQuestions: "the extension's `ask` tool (omp's schema) → RPC select or input dialogs → `question.asked`, answered by API or the next message",
			cConfig: "agenthost's pi extension asks by the room's mode, and pi reads no project folder (`PI_PACKAGE_DIR` names a copy of " +
				"its manifest whose project folder nobody has); tested with `.pi/settings.json` (a shell command prefix) and `.pi/extensions` modules",
		},
		gaps: piGaps(),
	},
	{
		id: "omp acp", transport: "acp", kind: agents.OMP,
		shell:   shellCmd("bash", "command", nil),
		mcpName: ompMCP,
		ask:     ompAsk,
		model:   agents.ModelID, modelSeen: "fake-model",
		how: map[string]string{
			cConfig: "`--approval-mode always-ask` (omp acp's own default lets writes through), the `--config` overlay (the workspace's " +
				"MCP files, per-tool policies and language servers off, every provider that loads modules, plugins or settings off) and " +
				"`--no-extensions`, its process started in its own folder; tested as omp over RPC; a workspace with `.omp/plugins` is refused",
		},
		gaps: map[string]string{cPooled: acpNoPool},
	},
	{
		id: "claude", transport: "acp", kind: agents.Claude,
		shell:   shellCmd("Bash", "command", map[string]any{"description": "run it"}),
		mcpName: doubleMCP,
		ask:     claudeAsk,
		model:   "haiku", modelSeen: "claude-haiku-5-5",
		how: map[string]string{
			cAllow: "settings `defaultMode: default` (its default mode never asks)",
			cConfig: "`_meta.claudeCode.options.settingSources: [\"user\"]` (the adapter also loads project and local settings), " +
				"bypass mode not offered, `session/set_mode default`, hooks off; tested with `.claude/settings.json` and " +
				"`settings.local.json` (`bypassPermissions`, `Bash` allowed, `SessionStart`, `UserPromptSubmit` and `PreToolUse` hooks)",
			cMCP:       "`_meta.claudeCode.options.strictMcpConfig` in `session/new` and `session/load`: Claude Code ignores the workspace's own `.mcp.json`",
			cCleanup:   "its tool shells run in sessions of their own and its `claude` CLI outlives the adapter: the custody sweep ends them",
			cQuestions: "here the form is claude's `AskUserQuestion`: one room question per choice field (its header on a second line), its optional `_custom` free-text field taking an answer outside the options",
			cUsage:     "the cost is Claude Code's own price for its model name; its title requests are not counted",
		},
		gaps: map[string]string{cPooled: acpNoPool},
	},
	{
		id: "codex", transport: "acp", kind: agents.Codex,
		shell: shellCmd("exec_command", "cmd", map[string]any{
			"sandbox_permissions": "require_escalated", "justification": "run it",
		}),
		mcpName: doubleMCP,
		ask:     codexAsk,
		model:   "gpt-5.5[low]", modelSeen: "gpt-5.5",
		how: map[string]string{
			cReply:     "codex opens every turn's text with a warning that the scripted model's metadata is unknown",
			cAllow:     "asks only for a command that requests escalation out of its workspace-write sandbox",
			cDeny:      "codex ends a turn whose tool was denied as `cancelled`; the room counts it settled",
			cWorkspace: "plus its own workspace-write sandbox",
			cConfig:    "codex ignores an untrusted project's `.codex/config.toml`; tested with `approval_policy = \"never\"`, `danger-full-access` and a `notify` command",
			cConfined: "codex's own bubblewrap sandbox cannot start inside Landlock (no mounts, no uid map): a command codex would sandbox fails, " +
				"and only commands asked to run escalated (an approval) run; a yolo room's codex runs without its sandbox, inside agenthost's",
			cMCP:     "codex offers each server's tools in a Responses API namespace",
			cCleanup: "codex also ends its whole tree itself on stdin EOF",
			cUsage:   "codex reports no cost: 0",
		},
		gaps: map[string]string{
			cQuestions:  "codex's `request_user_input` tool never reaches the client as a question over ACP",
			cBackground: "codex ends what a command leaves running when the command returns, so no work outlives its tool call",
			cToolsAsked: "codex asks its own permission for an MCP tool call in a request that names nothing (kind `execute`, no title, no input), " +
				"which agenthost cannot tell from a command's: a person is asked twice, the room's approval second, with the arguments",
		},
	},
	{
		id: "copilot", transport: "acp", kind: agents.Copilot,
		shell:   shellCmd("bash", "command", map[string]any{"description": "run it", "mode": "sync", "initial_wait": 30}),
		mcpName: dashMCP,
		how: map[string]string{
			cUsage:   "copilot's answer carries the process's running total, its input counting the cache too: differenced per turn; no cost reported: 0",
			cCleanup: "its tool shells run in sessions of their own: the custody sweep ends them",
			cConfig: "tested with a `.github/copilot/settings.json` carrying hooks (not run); copilot runs a repository's " +
				"`.github/hooks` whatever its home says (`disableAllHooks` there covers only the home's own), so it is not started in " +
				"a workspace (or git repository) that has them: the turn fails naming them, and no hook runs",
		},
		gaps: map[string]string{
			cQuestions: "copilot offers the model no question tool in ACP mode",
			cModel:     "copilot offers neither a session model list nor a `model` config option over ACP; its model is fixed by the recipe (`COPILOT_MODEL`)",
			cMCP:       "copilot 1.0.102 does not start the stdio `mcpServers` of `session/new` (it does start http ones: the room tools): their tools never reach the model",
		},
	},
}
