package room

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Defaults for Config and Options.
const (
	DefaultTurnTimeout     = 300 * time.Second
	DefaultLiveness        = 120 * time.Second
	DefaultApprovalTimeout = 10 * time.Minute
	DefaultQuestionTimeout = 10 * time.Minute
	DefaultIdleAfter       = 10 * time.Minute
	DefaultMaxResident     = 8
	DefaultQueueLimit      = 64
	DefaultShutdownBudget  = 10 * time.Second
	DefaultTranscriptBytes = 32 << 10
	// MaxMessageBytes bounds a submitted message's text.
	MaxMessageBytes = 256 << 10
)

// Approval modes.
const (
	ApprovalAsk  = "always-ask"
	ApprovalYolo = "yolo"
)

// Delivery modes of a message.
const (
	DeliverQueue    = "queue"
	DeliverSteer    = "steer"
	DeliverFollowUp = "follow_up"
)

// Config is a room's agent configuration. The manager's Config holds the
// defaults; a room's override replaces the fields it sets.
type Config struct {
	// Agent names the agent kind for the transport ("omp", "pi", ...).
	Agent string
	// Command, if set, is the agent's command line, run verbatim.
	Command []string
	// Model and Thinking are the agent's model and thinking level.
	Model, Thinking string
	// Instructions are appended to the agent's system prompt.
	Instructions string
	// ApprovalMode is ApprovalAsk (default) or ApprovalYolo.
	ApprovalMode string
	// TurnTimeout bounds a turn's active time (default 300 s); Liveness
	// bounds the silence of an agent not waiting on a person (default
	// 120 s). Time spent waiting on a person counts against neither.
	TurnTimeout, Liveness time.Duration
	// ApprovalTimeout and QuestionTimeout bound a person's answer
	// (default 10 min each): an expired approval is denied, an expired
	// question cancelled.
	ApprovalTimeout, QuestionTimeout time.Duration
	// IdleAfter, if set, replaces Options.IdleAfter for the room (a
	// room's own setting; the Manager's Config leaves it 0).
	IdleAfter time.Duration
	// Env is added to the agent's environment: a provider key goes here,
	// in that provider's variable. Never logged, never stored.
	Env []string `json:"-"`
	// MCP are the room's MCP servers, written into its agent's own
	// configuration only (omp; pi has no MCP). The name "agenthost" is
	// reserved.
	MCP map[string]MCPServer `json:"-"`
	// MaxLineBytes caps one line from the agent (0: the transport's
	// default, 64 MiB for RPC agents).
	MaxLineBytes int
	// Limits bound the room's processes (see Limits): the Manager's are
	// every room's defaults and ceilings, a room's settings may lower
	// them.
	Limits Limits
}

// merge returns c with o's set fields over it.
func (c Config) merge(o Config) Config {
	if o.Agent != "" {
		c.Agent = o.Agent
	}
	if len(o.Command) > 0 {
		c.Command = o.Command
	}
	for _, p := range []struct{ dst, src *string }{
		{&c.Model, &o.Model}, {&c.Thinking, &o.Thinking}, {&c.Instructions, &o.Instructions}, {&c.ApprovalMode, &o.ApprovalMode},
	} {
		if *p.src != "" {
			*p.dst = *p.src
		}
	}
	for _, p := range []struct{ dst, src *time.Duration }{
		{&c.TurnTimeout, &o.TurnTimeout}, {&c.Liveness, &o.Liveness},
		{&c.ApprovalTimeout, &o.ApprovalTimeout}, {&c.QuestionTimeout, &o.QuestionTimeout}, {&c.IdleAfter, &o.IdleAfter},
	} {
		if *p.src > 0 {
			*p.dst = *p.src
		}
	}
	if len(o.Env) > 0 {
		c.Env = append(slices.Clip(c.Env), o.Env...)
	}
	if o.MCP != nil {
		c.MCP = o.MCP
	}
	if o.MaxLineBytes > 0 {
		c.MaxLineBytes = o.MaxLineBytes
	}
	c.Limits = c.Limits.merge(o.Limits)
	return c
}

func (c *Config) fill() {
	if c.ApprovalMode == "" {
		c.ApprovalMode = ApprovalAsk
	}
	if c.TurnTimeout <= 0 {
		c.TurnTimeout = DefaultTurnTimeout
	}
	if c.Liveness <= 0 {
		c.Liveness = DefaultLiveness
	}
	if c.ApprovalTimeout <= 0 {
		c.ApprovalTimeout = DefaultApprovalTimeout
	}
	if c.QuestionTimeout <= 0 {
		c.QuestionTimeout = DefaultQuestionTimeout
	}
}

// unsafeFlags skip the agent's approvals; a custom command may carry them
// only in yolo mode.
var unsafeFlags = []string{"--yolo", "--auto-approve", "--approval-mode=yolo", "--approval-mode=write"}

// validate says what is wrong with a filled config.
func (c Config) validate() error {
	switch c.ApprovalMode {
	case ApprovalAsk, ApprovalYolo:
	default:
		return fmt.Errorf("room: approval mode %q: want %q or %q", c.ApprovalMode, ApprovalAsk, ApprovalYolo)
	}
	if err := validateMCP(c.MCP); err != nil {
		return err
	}
	if c.ApprovalMode == ApprovalYolo {
		return nil
	}
	for i, a := range c.Command {
		if slices.Contains(unsafeFlags, a) ||
			a == "--approval-mode" && i+1 < len(c.Command) && (c.Command[i+1] == "yolo" || c.Command[i+1] == "write") {
			return fmt.Errorf("room: the agent command carries %q, which skips approvals; set the approval mode to yolo to allow it", strings.SplitN(a, "=", 2)[0])
		}
	}
	return nil
}

// Options configure a Manager. Store and Transport are required.
type Options struct {
	Store     Store
	Transport Transport
	// Root holds the rooms' agent homes (and their workspaces unless
	// Workspaces is set), one folder per room. New makes it, and
	// Workspaces, absolute (from the working folder).
	Root string
	// Workspaces, if set, holds the rooms' workspaces instead of Root.
	Workspaces string
	// Config is every room's default configuration.
	Config Config
	// RoomConfig, if set, gives a room's overrides.
	RoomConfig func(room string) Config
	// Policy, if set, decides approvals first: return Allow or Deny, or
	// Ask to leave it to a person.
	Policy func(room string, req ApprovalRequest) Decision
	// MaxResident bounds the agents running at once (default 8).
	MaxResident int
	// IdleAfter releases a room's agent after that long without a turn
	// (default 10 min; a room's settings may say otherwise).
	IdleAfter time.Duration
	// Budget is every room's budget, limit by limit, unless its settings
	// set that limit (here 0 is none; a room's negative limit is none
	// too: see Budget).
	Budget Budget
	// Agents, if set, are the agent kinds a room's settings may name (the
	// transport's); nil takes any.
	Agents []string
	// Sources, if set, prepares the workspaces rooms' settings name (git
	// repositories); nil refuses such settings.
	Sources WorkspaceSource
	// QueueLimit bounds each room's waiting messages (default 64).
	QueueLimit int
	// ShutdownBudget bounds Close (default 10 s), shared by all rooms.
	ShutdownBudget time.Duration
	// Tools are offered to every room's agent beside the built-in
	// room_post and room_info. Names are unique; "agenthost" is reserved.
	Tools []Tool
	// MCP, if set, resolves a room's MCP servers (replacing Config.MCP
	// for that room); an error fails the room's agent start.
	MCP func(ctx context.Context, room, workspace string) (map[string]MCPServer, error)
	// TranscriptBytes bounds the transcript given to a fresh session
	// after a lost one (default 32 KiB).
	TranscriptBytes int
	// Cluster, if set, places rooms on several hosts (see Cluster); nil
	// runs every room of the store here.
	Cluster Cluster
	// Snapshots, if set, records each room's workspace before and after
	// every turn: turn.ended counts the changes, and TurnDiff and Revert
	// tell and take back a turn's changes.
	Snapshots Snapshots
	// SnapshotTimeout bounds each snapshot, diff and revert (default
	// 60 s); a turn whose snapshot fails or times out ends as it would,
	// with its changes unknown.
	SnapshotTimeout time.Duration
	Logger          *slog.Logger
	// Observe, if set, is told every event the rooms' logs commit here,
	// once committed, a commit's events at once and in their order, and
	// the steps of turns no event starts (Phase): tracing's seam. What one
	// piece of a room's work writes after another is told after it (a
	// message's acceptance before its turn, a turn's events before its
	// end); writes that race (a person's decision and the agent's events)
	// may be told in either order. It runs on the rooms' own goroutines
	// with no lock held: it must return at once (queue, never wait) and
	// must not call the Manager.
	Observe func([]Observed)
}

func (o *Options) fill() {
	if o.MaxResident <= 0 {
		o.MaxResident = DefaultMaxResident
	}
	if o.IdleAfter <= 0 {
		o.IdleAfter = DefaultIdleAfter
	}
	if o.QueueLimit <= 0 {
		o.QueueLimit = DefaultQueueLimit
	}
	if o.ShutdownBudget <= 0 {
		o.ShutdownBudget = DefaultShutdownBudget
	}
	if o.TranscriptBytes <= 0 {
		o.TranscriptBytes = DefaultTranscriptBytes
	}
	if o.SnapshotTimeout <= 0 {
		o.SnapshotTimeout = DefaultSnapshotTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Decision is a policy's answer to an approval.
type Decision int

// Decisions.
const (
	Ask Decision = iota
	Allow
	Deny
)
