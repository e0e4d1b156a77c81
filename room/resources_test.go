package room

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// meteredTransport starts meteredAgents: fakeAgents whose processes are
// measured, acting on these prompts besides the fakeAgent's:
//
//	work        uses 1.5 s of CPU, 3 processes, a peak of 123 bytes
//	oom-tool    a tool is killed at the memory limit; the turn settles
//	fork-tool   a tool's forks are refused (2) at the pids limit
//	oom-agent   the agent itself is killed at the memory limit
type meteredTransport struct {
	*fakeTransport
	res Resources
}

func (t *meteredTransport) Start(ctx context.Context, spec AgentSpec) (Agent, error) {
	a, err := t.fakeTransport.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &meteredAgent{fakeAgent: a.(*fakeAgent), limits: spec.Config.Limits, res: t.res}, nil
}

// Resources implements Resourced: how limits would hold.
func (t *meteredTransport) Resources() Resources { return t.res }

type meteredAgent struct {
	*fakeAgent
	limits Limits
	res    Resources
	mu     sync.Mutex
	m      Meter
	resets int
}

func (a *meteredAgent) Meter(ctx context.Context) (Meter, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.m, nil
}

func (a *meteredAgent) ResetPeak(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.m.PeakMemory = 0
	a.resets++
	return nil
}

func (a *meteredAgent) Resources() Resources {
	r := a.res
	r.Memory, r.Pids, r.CPU = int64(a.limits.Memory), a.limits.Pids, a.limits.CPU
	return r
}

func (a *meteredAgent) change(f func(m *Meter)) {
	a.mu.Lock()
	f(&a.m)
	a.mu.Unlock()
}

func (a *meteredAgent) Run(ctx context.Context, text string) (TurnResult, error) {
	h := a.spec.Handler
	switch text {
	case "work":
		a.change(func(m *Meter) {
			m.CPU += 1500 * time.Millisecond
			m.Processes += 3
			m.PeakMemory = 123
			m.Metered = true
		})
		return TurnResult{Text: "worked"}, nil
	case "oom-tool", "fork-tool":
		h.Event(AgentEvent{Kind: KindToolStarted, Tool: "bash", CallID: "c1", Input: "big"})
		a.change(func(m *Meter) {
			if text == "oom-tool" {
				m.OOMKills++
			} else {
				m.ForksRefused += 2
			}
			m.Metered = true
		})
		h.Event(AgentEvent{Kind: KindToolEnded, Tool: "bash", CallID: "c1", Output: "Killed", IsError: true})
		return TurnResult{Text: "the tool failed"}, nil
	case "oom-agent":
		a.change(func(m *Meter) { m.OOMKills++; m.Metered = true })
		a.once.Do(func() { close(a.done) })
		return TurnResult{}, errors.New("the agent exited: signal: killed")
	}
	return a.fakeAgent.Run(ctx, text)
}

func newMeteredHarness(t *testing.T, limits Limits) (*harness, *meteredTransport) {
	t.Helper()
	mt := &meteredTransport{fakeTransport: newFakeTransport(),
		res: Resources{Enforced: true, By: event.ResourcesBy{Memory: "cgroup-v1", Pids: "cgroup-v1", CPU: "cgroup-v1"}}}
	h := newHarness(t, Options{Transport: mt, Config: Config{Limits: limits}})
	return h, mt
}

// eventsOf are the room's events of type typ, decoded.
func eventsOf[T any](t *testing.T, h *harness, room, typ string) []T {
	t.Helper()
	evs, err := h.db.Events(t.Context(), room, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	for _, ev := range evs {
		if ev.Type == typ {
			var v T
			if err := json.Unmarshal(ev.Data, &v); err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
	}
	return out
}

// Each turn.ended carries what the turn's processes used (the CPU and
// processes of the turn alone, the peak since its start), and the room's
// state their totals.
func TestCompute_OnTurnEndedAndInTheRoomsTotals(t *testing.T) {
	h, _ := newMeteredHarness(t, Limits{})
	for range 2 {
		h.turnEnded("r", h.submit("r", "work"))
	}
	ends := eventsOf[event.TurnEnded](t, h, "r", event.TypeTurnEnded)
	want := record.Compute{CPUSeconds: 1.5, PeakMemoryBytes: 123, Processes: 3}
	if len(ends) != 2 || ends[0].Compute == nil || *ends[0].Compute != want || ends[1].Compute == nil || *ends[1].Compute != want {
		t.Fatalf("turn.ended: %+v", ends)
	}
	st, err := h.m.State(t.Context(), "r")
	if err != nil {
		t.Fatal(err)
	}
	if st.Compute != (record.Compute{CPUSeconds: 3, PeakMemoryBytes: 123, Processes: 6}) {
		t.Fatalf("the room's compute: %+v", st.Compute)
	}
	// An agent that measures nothing: no compute.
	h2 := newHarness(t, Options{})
	h2.turnEnded("r", h2.submit("r", "hi"))
	if ends := eventsOf[event.TurnEnded](t, h2, "r", event.TypeTurnEnded); len(ends) != 1 || ends[0].Compute != nil {
		t.Fatalf("an unmeasured turn.ended: %+v", ends)
	}
}

// A tool killed at the memory limit, or whose forks were refused, is
// recorded as room.limit (which limit, how many, the limit in force) and
// the turn settles; an agent killed itself fails its turn with a reason
// naming the limit, and the room's next message runs on a new agent.
func TestLimits_ReachedAreRecorded(t *testing.T) {
	h, mt := newMeteredHarness(t, Limits{Memory: 256 << 20, Pids: 64})
	if d := h.turnEnded("r", h.submit("r", "oom-tool")); d["outcome"] != OutcomeSettled {
		t.Fatalf("the tool's turn: %v", d)
	}
	h.turnEnded("r", h.submit("r", "fork-tool"))
	d := h.turnEnded("r", h.submit("r", "oom-agent"))
	if d["outcome"] != OutcomeFailed || !strings.Contains(d["reason"].(string), "memory limit (256 MiB)") {
		t.Fatalf("the killed agent's turn: %v", d)
	}
	if d := h.turnEnded("r", h.submit("r", "after")); d["outcome"] != OutcomeSettled {
		t.Fatalf("the next turn: %v", d)
	}
	lims := eventsOf[event.RoomLimit](t, h, "r", event.TypeRoomLimit)
	ends := eventsOf[event.TurnEnded](t, h, "r", event.TypeTurnEnded)
	want := []event.RoomLimit{
		{Limit: event.LimitMemory, Count: 1, Value: 256 << 20, TurnID: ends[0].TurnID},
		{Limit: event.LimitPids, Count: 2, Value: 64, TurnID: ends[1].TurnID},
		{Limit: event.LimitMemory, Count: 1, Value: 256 << 20, TurnID: ends[2].TurnID, AgentKilled: true},
	}
	if len(lims) != len(want) {
		t.Fatalf("room.limit: %+v", lims)
	}
	for i := range want {
		if lims[i] != want[i] {
			t.Errorf("room.limit %d: %+v, want %+v", i, lims[i], want[i])
		}
	}
	mt.mu.Lock()
	starts := len(mt.starts)
	mt.mu.Unlock()
	if starts != 2 {
		t.Errorf("%d agent starts, want 2 (a new one after the killed)", starts)
	}
}

// The server's limits are every room's defaults and ceilings: a room's
// settings lower them (sizes as numbers or strings), never raise them,
// and the agent starts with the room's; the state says how they hold.
func TestResources_SettingsUnderTheCeiling(t *testing.T) {
	h, mt := newMeteredHarness(t, Limits{Memory: 1 << 30, Pids: 256, CPU: 2})
	ctx := t.Context()
	for _, tc := range []struct{ body, want string }{
		{`{"resources": {"memory": "2G"}}`, "over the server's ceiling"},
		{`{"resources": {"pids": 1000}}`, "over the server's ceiling"},
		{`{"resources": {"cpu": 3}}`, "over the server's ceiling"},
		{`{"resources": {"pids": 3}}`, "resources.pids must be"},
		{`{"resources": {"memory": "12 parsecs"}}`, "size"},
		{`{"resources": {"memory": 1024}}`, "resources.memory must be"},
		{`{"resources": {"cpu": -1}}`, "resources.cpu must be"},
	} {
		s, err := ParseSettings([]byte(tc.body))
		if err == nil {
			_, err = h.m.SetSettings(ctx, "r", s)
		}
		if !errors.Is(err, ErrBadSettings) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.body, err, tc.want)
		}
	}
	s, err := ParseSettings([]byte(`{"resources": {"memory": "512M", "cpu": 0.5}}`))
	if err != nil {
		t.Fatal(err)
	}
	eff, err := h.m.SetSettings(ctx, "r", s)
	if err != nil {
		t.Fatal(err)
	}
	want := Limits{Memory: 512 << 20, Pids: 256, CPU: 0.5}
	if eff.Resources != want {
		t.Fatalf("effective resources %+v, want %+v", eff.Resources, want)
	}
	b, _ := json.Marshal(eff)
	if !strings.Contains(string(b), `"resources":{"memory":536870912,"pids":256,"cpu":0.5}`) {
		t.Errorf("effective settings JSON: %s", b)
	}
	st, err := h.m.State(ctx, "r")
	if err != nil || st.Resources == nil || st.Resources.Memory != 512<<20 || st.Resources.Pids != 256 || !st.Resources.Enforced {
		t.Fatalf("the state's resources before a start: %+v, %v", st.Resources, err)
	}
	h.turnEnded("r", h.submit("r", "hi"))
	mt.mu.Lock()
	got := mt.starts[len(mt.starts)-1].Config.Limits
	mt.mu.Unlock()
	if got != want {
		t.Fatalf("the agent started with %+v, want %+v", got, want)
	}
	started := eventsOf[event.AgentStarted](t, h, "r", event.TypeAgentStarted)
	if len(started) != 1 || started[0].Resources == nil || started[0].Resources.Memory != 512<<20 {
		t.Fatalf("agent.started: %+v", started)
	}
	// Changed: the next start has them (next_start says so meanwhile).
	s.Resources.Pids = 128
	if eff, err = h.m.SetSettings(ctx, "r", s); err != nil || !strings.Contains(strings.Join(eff.NextStart, ","), "resources") {
		t.Fatalf("next_start %v, %v", eff.NextStart, err)
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"": 0, "0": 0, "1048576": 1 << 20, "512M": 512 << 20, "512m": 512 << 20, "512MB": 512 << 20, "512MiB": 512 << 20,
		"2G": 2 << 30, "1.5G": 3 << 29, "1T": 1 << 40, "64k": 64 << 10, "100B": 100, " 4 G ": 4 << 30,
	} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"x", "1.5", "-1G", "2Q", "G", "1e30G", "NaNG"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q): no error", in)
		}
	}
	for n, want := range map[int64]string{4 << 30: "4 GiB", 512 << 20: "512 MiB", 3 << 29: "1.5 GiB", 100: "100 bytes"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
