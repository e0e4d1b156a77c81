package room

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// Settings are a room's own settings, set by the program that hosts it
// (the server's PUT /v1/rooms/{room}/config): each field set replaces the
// Manager's default for that room (Options.Config, and Options.Budget).
// Stored durably with the room (SettingsStore); its JSON names are the
// API's.
type Settings struct {
	Agent        string `json:"agent,omitempty"`
	Model        string `json:"model,omitempty"`
	Thinking     string `json:"thinking,omitempty"`
	Instructions string `json:"instructions,omitempty"`
	ApprovalMode string `json:"approval_mode,omitempty"`
	// Durations are Go durations as strings ("5m", "90s").
	TurnTimeout     Duration             `json:"turn_timeout,omitempty"`
	ApprovalTimeout Duration             `json:"approval_timeout,omitempty"`
	QuestionTimeout Duration             `json:"question_timeout,omitempty"`
	IdleAfter       Duration             `json:"idle_after,omitempty"`
	MCP             map[string]MCPServer `json:"mcp,omitempty"`
	// Workspace, if set, is a git repository the room's workspace holds,
	// checked out before its first turn (Options.Sources).
	Workspace *Workspace `json:"workspace,omitempty"`
	Budget    Budget     `json:"budget"`
	// Resources lower the server's limits of the room's processes
	// (Limits; never above them), from the agent's next start.
	Resources Limits `json:"resources,omitzero"`
}

// Budget bounds what a room may spend: once its totals reach any limit,
// the running turn finishes, no new turn starts, and new messages are
// refused (ErrBudgetExhausted) until the budget is raised. In a room's
// effective settings (Effective, the Manager's Options.Budget) 0 is no
// limit. In its own Settings a limit of 0 takes the Manager's, and a
// negative one (NoLimit) is no limit even where the Manager has one: the
// API's 0 (ParseSettings), which a room could otherwise not be given on a
// server with a default budget.
type Budget struct {
	Tokens  int64   `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
	Turns   int64   `json:"turns"`
}

// NoLimit, as a limit of a room's own Budget, is no limit, whatever the
// Manager's default.
const NoLimit = -1

// IsZero: no limit at all.
func (b Budget) IsZero() bool { return b == Budget{} }

// over says which limit of b the totals reach ("" for none).
func (b Budget) over(turns int64, u record.Usage) string {
	switch {
	case b.Tokens > 0 && u.Tokens() >= b.Tokens:
		return fmt.Sprintf("%d of %d tokens used", u.Tokens(), b.Tokens)
	case b.CostUSD > 0 && u.CostUSD >= b.CostUSD:
		return fmt.Sprintf("$%.4f of $%.4f spent", u.CostUSD, b.CostUSD)
	case b.Turns > 0 && turns >= b.Turns:
		return fmt.Sprintf("%d of %d turns run", turns, b.Turns)
	}
	return ""
}

// ErrBudgetExhausted is returned by Submit for a room whose totals reached
// its budget (the server's 429); the message says which limit.
var ErrBudgetExhausted = errors.New("room budget exhausted")

// ErrBadSettings is returned (wrapped, with the reason) by SetSettings
// for settings it refuses.
var ErrBadSettings = errors.New("room: bad settings")

// ErrNoSettings is returned by SetSettings when the Store keeps no room
// settings (it is not a SettingsStore).
var ErrNoSettings = errors.New("room: this store keeps no room settings")

// Duration is a time.Duration whose JSON is a Go duration string.
type Duration time.Duration

// MarshalJSON writes d as "1m30s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string ("" is 0).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"5m\" or \"90s\"")
	}
	if s == "" {
		*d = 0
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: want a Go duration such as \"5m\" or \"90s\"", s)
	}
	*d = Duration(v)
	return nil
}

// SettingsStore is a Store that keeps each room's Settings (as the JSON
// the room writes). Both stores of this module are; with another, rooms
// have no settings of their own.
type SettingsStore interface {
	// RoomSettings returns the room's settings (nil when it has none).
	RoomSettings(ctx context.Context, room string) (json.RawMessage, error)
	// PutRoomSettings stores the room's settings, creating the room.
	PutRoomSettings(ctx context.Context, room string, settings json.RawMessage) error
}

// ExclusiveStore is a SettingsStore that says whether this Manager alone
// changes it (a database file the host holds locked). When it does, the
// Manager reads a room's settings once and then keeps what it writes,
// instead of reading them again before each message and each turn, as a
// store that other hosts share needs.
type ExclusiveStore interface {
	SettingsStore
	Exclusive() bool
}

// Bounds of settings.
const (
	maxInstructions = 64 << 10
	maxName         = 200
	maxDuration     = 7 * 24 * time.Hour
)

// ParseSettings decodes settings strictly (an unknown field is an error)
// and checks them; readOnly names fields an answer carries that a client
// may send back and that are ignored.
func ParseSettings(b []byte, readOnly ...string) (Settings, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || raw == nil {
		return Settings{}, fmt.Errorf("%w: the settings must be a JSON object", ErrBadSettings)
	}
	for _, k := range readOnly {
		delete(raw, k)
	}
	for k, v := range raw {
		// A null would read as the field left out: the field's type is
		// not null (workspace's is: no workspace).
		if k != "workspace" && string(bytes.TrimSpace(v)) == "null" {
			return Settings{}, fmt.Errorf("%w: %s must not be null (leave it out for the server's default)", ErrBadSettings, k)
		}
	}
	clean, _ := json.Marshal(raw)
	dec := json.NewDecoder(bytes.NewReader(clean))
	dec.DisallowUnknownFields()
	var s Settings
	if err := dec.Decode(&s); err != nil {
		return Settings{}, fmt.Errorf("%w: %s", ErrBadSettings, DecodeError(err))
	}
	if s.Budget.Tokens < 0 || s.Budget.Turns < 0 || s.Budget.CostUSD < 0 {
		return Settings{}, fmt.Errorf("%w: budget limits must be 0 (none) or more", ErrBadSettings)
	}
	if err := s.check(nil); err != nil {
		return Settings{}, err
	}
	// A limit given as 0 is no limit; one left out takes the Manager's.
	var given map[string]json.RawMessage
	_ = json.Unmarshal(raw["budget"], &given)
	for k, p := range map[string]*int64{"tokens": &s.Budget.Tokens, "turns": &s.Budget.Turns} {
		if _, ok := given[k]; ok && *p == 0 {
			*p = NoLimit
		}
	}
	if _, ok := given["cost_usd"]; ok && s.Budget.CostUSD == 0 {
		s.Budget.CostUSD = NoLimit
	}
	return s, nil
}

// DecodeError is a JSON decoding error in the API's words: JSON types and
// the field's path, never a Go type.
func DecodeError(err error) string {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		what := "the body"
		if ute.Field != "" {
			what = ute.Field
		}
		return fmt.Sprintf("%s must be %s, not %s", what, jsonType(ute.Type), ute.Value)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// jsonType names the JSON type a Go type decodes from.
func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "another JSON type"
}

// check says what is wrong with s; agents, if not nil, are the agent
// kinds the transport runs.
func (s Settings) check(agents []string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadSettings}, a...)...)
	}
	for _, f := range []struct{ name, v string }{{"agent", s.Agent}, {"model", s.Model}, {"thinking", s.Thinking}} {
		if len(f.v) > maxName || strings.IndexFunc(f.v, func(r rune) bool { return r <= ' ' || r == 0x7f || !unicode.IsPrint(r) }) >= 0 {
			return bad("%s must be at most %d printable characters without spaces", f.name, maxName)
		}
	}
	if s.Agent != "" && agents != nil && !slices.Contains(agents, s.Agent) {
		if len(agents) == 0 {
			return bad("agent %q: this server runs one command of its own, which takes no agent name", s.Agent)
		}
		return bad("agent %q: this server runs %s", s.Agent, strings.Join(agents, ", "))
	}
	if len(s.Instructions) > maxInstructions {
		return bad("instructions are over %d bytes", maxInstructions)
	}
	if strings.IndexByte(s.Instructions, 0) >= 0 {
		// They go to the agent in its command line, which holds no NUL.
		return bad("instructions hold a NUL byte, which no agent's command line can carry")
	}
	switch s.ApprovalMode {
	case "", ApprovalAsk, ApprovalYolo:
	default:
		return bad("approval_mode %q: want %q or %q", s.ApprovalMode, ApprovalAsk, ApprovalYolo)
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"turn_timeout", s.TurnTimeout}, {"approval_timeout", s.ApprovalTimeout}, {"question_timeout", s.QuestionTimeout}, {"idle_after", s.IdleAfter}} {
		if d.v < 0 || time.Duration(d.v) > maxDuration || d.v > 0 && time.Duration(d.v) < time.Second {
			return bad("%s must be from 1s to %s (or 0 or empty for the server's default)", d.name, maxDuration)
		}
	}
	if err := validateMCP(s.MCP); err != nil {
		return bad("%s", strings.TrimPrefix(err.Error(), "room: "))
	}
	if w := s.Workspace; w != nil && (w.Git == "" || w.Ref == "") {
		return bad("workspace needs git (the repository's URL) and ref (a branch, tag or commit)")
	}
	if s.Budget.CostUSD != s.Budget.CostUSD {
		return bad("budget limits must be numbers")
	}
	if err := s.Resources.check(); err != nil {
		return bad("%s", err)
	}
	return nil
}

// config is s as Config overrides.
func (s Settings) config() Config {
	return Config{Agent: s.Agent, Model: s.Model, Thinking: s.Thinking, Instructions: s.Instructions, ApprovalMode: s.ApprovalMode,
		TurnTimeout: time.Duration(s.TurnTimeout), ApprovalTimeout: time.Duration(s.ApprovalTimeout),
		QuestionTimeout: time.Duration(s.QuestionTimeout), IdleAfter: time.Duration(s.IdleAfter), MCP: s.MCP, Limits: s.Resources}
}

// Effective is a room's settings with the Manager's defaults filled in,
// and which of them the room's running agent does not have yet.
type Effective struct {
	Settings
	// NextStart names the fields that differ from what the room's
	// resident agent was started with: they take effect at its next
	// start (the next turn after it is released, idle or not). Empty
	// when no agent runs.
	NextStart []string `json:"next_start"`
}

// MarshalJSON writes every field, set or not (the settings' own JSON
// leaves the unset out).
func (e Effective) MarshalJSON() ([]byte, error) {
	mcp := e.MCP
	if mcp == nil {
		mcp = map[string]MCPServer{}
	}
	next := e.NextStart
	if next == nil {
		next = []string{}
	}
	return json.Marshal(struct {
		Agent           string               `json:"agent"`
		Model           string               `json:"model"`
		Thinking        string               `json:"thinking"`
		Instructions    string               `json:"instructions"`
		ApprovalMode    string               `json:"approval_mode"`
		TurnTimeout     Duration             `json:"turn_timeout"`
		ApprovalTimeout Duration             `json:"approval_timeout"`
		QuestionTimeout Duration             `json:"question_timeout"`
		IdleAfter       Duration             `json:"idle_after"`
		MCP             map[string]MCPServer `json:"mcp"`
		Workspace       *Workspace           `json:"workspace"`
		Budget          Budget               `json:"budget"`
		Resources       Limits               `json:"resources"`
		NextStart       []string             `json:"next_start"`
	}{e.Agent, e.Model, e.Thinking, e.Instructions, e.ApprovalMode, e.TurnTimeout, e.ApprovalTimeout, e.QuestionTimeout, e.IdleAfter, mcp, e.Workspace, e.Budget, e.Resources, next})
}

// startFields are the settings an agent takes at its start.
var startFields = []string{"agent", "model", "thinking", "instructions", "approval_mode", "mcp", "resources"}

// startDiff names the start fields in which a and b differ.
func startDiff(a, b Config) []string {
	var out []string
	for _, f := range startFields {
		var same bool
		switch f {
		case "agent":
			same = a.Agent == b.Agent
		case "model":
			same = a.Model == b.Model
		case "thinking":
			same = a.Thinking == b.Thinking
		case "instructions":
			same = a.Instructions == b.Instructions
		case "approval_mode":
			same = a.ApprovalMode == b.ApprovalMode
		case "mcp":
			same = maps.EqualFunc(a.MCP, b.MCP, func(x, y MCPServer) bool {
				bx, _ := json.Marshal(x)
				by, _ := json.Marshal(y)
				return bytes.Equal(bx, by)
			})
		case "resources":
			same = a.Limits == b.Limits
		}
		if !same {
			out = append(out, f)
		}
	}
	return out
}

// Settings returns the room's own settings (zero when it has none);
// ErrNotFound for a room the store does not know and that has none.
func (m *Manager) Settings(ctx context.Context, room string) (Settings, error) {
	if err := ValidateID(room); err != nil {
		return Settings{}, err
	}
	s, raw, err := m.loadSettings(ctx, room)
	if err != nil {
		return Settings{}, err
	}
	if raw == nil {
		if _, err := m.st.Room(ctx, room); err != nil {
			return Settings{}, err
		}
	}
	return s, nil
}

// loadSettings reads the room's stored settings (raw nil: none).
func (m *Manager) loadSettings(ctx context.Context, room string) (Settings, json.RawMessage, error) {
	ss, ok := m.st.(SettingsStore)
	if !ok {
		return Settings{}, nil, nil
	}
	raw, err := ss.RoomSettings(ctx, room)
	if err != nil || len(raw) == 0 {
		return Settings{}, nil, err
	}
	var s Settings
	if err := json.Unmarshal(raw, &s); err != nil {
		return Settings{}, nil, fmt.Errorf("room %q: stored settings unreadable: %w", room, err)
	}
	return s, raw, nil
}

// EffectiveSettings returns the room's settings with the defaults filled
// in (see Effective).
func (m *Manager) EffectiveSettings(ctx context.Context, room string) (Effective, error) {
	s, err := m.Settings(ctx, room)
	if err != nil {
		return Effective{}, err
	}
	return m.effective(room, s), nil
}

func (m *Manager) effective(room string, s Settings) Effective {
	c := m.opts.Config
	if m.opts.RoomConfig != nil {
		c = c.merge(m.opts.RoomConfig(room))
	}
	c = c.merge(s.config())
	c.fill()
	c.Limits = c.Limits.within(m.opts.Config.Limits)
	e := Effective{Settings: Settings{Agent: c.Agent, Model: c.Model, Thinking: c.Thinking, Instructions: c.Instructions,
		ApprovalMode: c.ApprovalMode, TurnTimeout: Duration(c.TurnTimeout), ApprovalTimeout: Duration(c.ApprovalTimeout),
		QuestionTimeout: Duration(c.QuestionTimeout), IdleAfter: Duration(m.idleAfter(c)), MCP: c.MCP, Workspace: m.heldWorkspace(room, s.Workspace), Budget: m.budget(s),
		Resources: c.Limits}, NextStart: []string{}}
	if e.MCP == nil {
		e.MCP = map[string]MCPServer{}
	}
	m.mu.Lock()
	r := m.rooms[room]
	m.mu.Unlock()
	if r != nil {
		r.mu.Lock()
		if r.agent != nil && r.startedCfg != nil {
			if d := startDiff(*r.startedCfg, c); d != nil {
				e.NextStart = d
			}
		}
		r.mu.Unlock()
	}
	return e
}

// budget is the room's budget: its own limits, else the Manager's (a
// negative own limit is none: see Budget).
func (m *Manager) budget(s Settings) Budget {
	b := s.Budget
	switch {
	case b.Tokens == 0:
		b.Tokens = m.opts.Budget.Tokens
	case b.Tokens < 0:
		b.Tokens = 0
	}
	switch {
	case b.CostUSD == 0:
		b.CostUSD = m.opts.Budget.CostUSD
	case b.CostUSD < 0:
		b.CostUSD = 0
	}
	switch {
	case b.Turns == 0:
		b.Turns = m.opts.Budget.Turns
	case b.Turns < 0:
		b.Turns = 0
	}
	return b
}

// idleAfter is how long the room's agent may idle (its own, else the
// Manager's).
func (m *Manager) idleAfter(c Config) time.Duration {
	if c.IdleAfter > 0 {
		return c.IdleAfter
	}
	return m.opts.IdleAfter
}

// SetSettings stores the room's settings (the whole object: a field left
// zero takes the default), creating the room, and returns the effective
// ones. Agent, model, thinking, instructions, approval mode, MCP and
// resources take effect at the agent's next start (Effective.NextStart
// says which are pending); resources above the Manager's ceilings
// (Config.Limits) are refused; timeouts at the next turn or approval, idle_after and the
// budget at once: a raised budget reopens the room.
func (m *Manager) SetSettings(ctx context.Context, room string, s Settings) (Effective, error) {
	if err := ValidateID(room); err != nil {
		return Effective{}, err
	}
	if err := s.check(m.opts.Agents); err != nil {
		return Effective{}, err
	}
	if over := s.Resources.over(m.opts.Config.Limits); over != "" {
		return Effective{}, fmt.Errorf("%w: %s", ErrBadSettings, over)
	}
	// The merged config must hold too (a yolo-only command flag).
	c := m.opts.Config.merge(s.config())
	c.fill()
	if err := c.validate(); err != nil {
		return Effective{}, fmt.Errorf("%w: %s", ErrBadSettings, strings.TrimPrefix(err.Error(), "room: "))
	}
	if err := m.checkThinking(room, s); err != nil {
		return Effective{}, err
	}
	ss, ok := m.st.(SettingsStore)
	if !ok {
		return Effective{}, ErrNoSettings
	}
	if err := m.checkWorkspace(ctx, room, s.Workspace); err != nil {
		return Effective{}, err
	}
	raw, err := json.Marshal(s)
	if err != nil {
		return Effective{}, err
	}
	// Through the door, and one at a time: the settings stored last are
	// the ones in force (another SetSettings stores and applies its own
	// before or after these, never between), and a purge either deletes
	// them with the room or comes first and leaves them to the new room.
	r, leave, err := m.enter(ctx, room, false)
	if err != nil {
		return Effective{}, err
	}
	defer leave()
	if err := r.settingsLock.enter(ctx, true); err != nil {
		return Effective{}, fmt.Errorf("room %q: waiting for its settings: %w", room, err)
	}
	defer r.settingsLock.leave(true)
	_, before, err := m.loadSettings(ctx, room)
	if err != nil {
		// Unreadable settings are replaced: every field counts as changed.
		before = nil
	}
	if err := ss.PutRoomSettings(ctx, room, raw); err != nil {
		return Effective{}, err
	}
	// The room takes them now on this host; another host that runs it
	// (a cluster) reads them before its next turn.
	m.applySettings(r, s, raw)
	m.recordSettings(r, changedFields(before, raw), tokenOf(ctx))
	m.kick(r)
	return m.effective(room, s), nil
}

// recordSettings writes settings.changed in the room's log, so the log
// answers who changed which settings. In a cluster only the room's holder
// writes its log: a change made through another node (or to a room no
// node holds yet) is in the settings and in that server's own log, not in
// the room's.
func (m *Manager) recordSettings(r *roomState, fields []string, by *event.TokenRef) {
	if c := m.opts.Cluster; c != nil && !c.Owns(r.id) {
		return
	}
	err := m.write(func(tx Tx) error {
		_, err := appendEvent(tx, r.id, event.SettingsChanged{Fields: fields, Token: by})
		return err
	})
	if err != nil {
		// The settings are stored and in force; only their record failed.
		m.log.Warn("room: recording a settings change failed", "room", r.id, "err", err)
	}
}

// changedFields names the top-level settings whose JSON differs between
// two stored settings objects (before nil: none were stored), sorted.
func changedFields(before, after json.RawMessage) []string {
	var a, b map[string]json.RawMessage
	if len(before) > 0 && json.Unmarshal(before, &a) != nil {
		a = nil
	}
	if json.Unmarshal(after, &b) != nil {
		b = nil
	}
	fields := []string{}
	for k, v := range b {
		if w, ok := a[k]; !ok || !bytes.Equal(compactJSON(w), compactJSON(v)) {
			if ok || !isZeroJSON(v) {
				fields = append(fields, k)
			}
		}
	}
	for k, w := range a {
		if _, ok := b[k]; !ok && !isZeroJSON(w) {
			fields = append(fields, k)
		}
	}
	slices.Sort(fields)
	return fields
}

// compactJSON is v without insignificant space (stored settings are
// Go-marshalled, so equal values are equal bytes once compacted).
func compactJSON(v json.RawMessage) []byte {
	var buf bytes.Buffer
	if json.Compact(&buf, v) != nil {
		return v
	}
	return buf.Bytes()
}

// isZeroJSON: a value that sets nothing (a budget of zeros, an empty
// object), so a field absent before and zero now is no change.
func isZeroJSON(v json.RawMessage) bool {
	var x any
	if json.Unmarshal(v, &x) != nil {
		return false
	}
	return isZeroValue(x)
}

func isZeroValue(x any) bool {
	switch x := x.(type) {
	case nil:
		return true
	case bool:
		return !x
	case float64:
		return x == 0
	case string:
		return x == ""
	case []any:
		return len(x) == 0
	case map[string]any:
		for _, v := range x {
			if !isZeroValue(v) {
				return false
			}
		}
		return true
	}
	return false
}

// checkThinking refuses a thinking level the room's agent does not take,
// when the transport knows the agent's levels (a custom command's are not
// known) and the settings name the level or the agent.
func (m *Manager) checkThinking(room string, s Settings) error {
	tl, ok := m.opts.Transport.(ThinkingLeveler)
	if !ok || s.Thinking == "" && s.Agent == "" {
		return nil
	}
	c := m.opts.Config
	if m.opts.RoomConfig != nil {
		c = c.merge(m.opts.RoomConfig(room))
	}
	c = c.merge(s.config())
	if c.Thinking == "" || len(c.Command) > 0 {
		return nil
	}
	levels := tl.ThinkingLevels(c.Agent)
	if levels == nil || slices.Contains(levels, c.Thinking) {
		return nil
	}
	agent := c.Agent
	if agent == "" {
		agent = "the agent"
	}
	return fmt.Errorf("%w: thinking %q: %s takes %s", ErrBadSettings, c.Thinking, agent, strings.Join(levels, ", "))
}

// kick starts the room's worker if messages wait.
func (m *Manager) kick(r *roomState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.queue) > 0 {
		m.ensureWorkerLocked(r)
	}
}

// refreshSettings reads the room's settings again (another host may have
// changed them) and applies them if they changed. With an ExclusiveStore
// it reads them only the first time.
func (m *Manager) refreshSettings(ctx context.Context, r *roomState) error {
	if _, ok := m.st.(SettingsStore); !ok {
		return nil
	}
	r.mu.Lock()
	known, gen := r.settingsRead && m.exclusive, r.settingsGen
	r.mu.Unlock()
	if known {
		return nil
	}
	s, raw, err := m.loadSettings(ctx, r.id)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.settingsGen != gen {
		// SetSettings applied newer ones while this read ran.
		return nil
	}
	m.applySettingsLocked(r, s, raw)
	return nil
}

// applySettings makes s, just written, the room's settings.
func (m *Manager) applySettings(r *roomState, s Settings, raw json.RawMessage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.settingsGen++
	m.applySettingsLocked(r, s, raw)
}

// applySettingsLocked makes s the room's settings when they differ from
// those it has (its config is filled again at next use).
func (m *Manager) applySettingsLocked(r *roomState, s Settings, raw json.RawMessage) {
	if r.settingsRaw == string(raw) && r.settingsRead {
		return
	}
	r.settings, r.settingsRaw, r.settingsRead = s, string(raw), true
	r.cfg = nil
	r.budgetNoted = false
}

// exhausted says which limit of its budget the room's totals reach (""
// for none, or no budget).
func (m *Manager) exhausted(ctx context.Context, room string, s Settings) (string, error) {
	b := m.budget(s)
	if b.IsZero() {
		return "", nil
	}
	rec, err := m.st.Room(ctx, room)
	if errors.Is(err, record.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return b.over(rec.Turns, rec.Usage), nil
}

// budgetErr is ErrBudgetExhausted naming the limit.
func budgetErr(limit string) error { return fmt.Errorf("%w: %s", ErrBudgetExhausted, limit) }
