package usage_test

import (
	"errors"
	"math"
	"testing"

	"github.com/agenthost/agenthost/internal/usage"
)

// The frames below are what the pinned agents sent on the built-in model (cut to the fields
// that matter, values as sent).

const (
	ompMessageEnd = `{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"done"}],` +
		`"usage":{"input":2297,"output":1,"cacheRead":2296,"cacheWrite":0,"totalTokens":4594,` +
		`"cost":{"input":0.006891,"output":0.000015,"cacheRead":0.0006887999999999999,"cacheWrite":0,"total":0.0075948000000000005}},"stopReason":"stop"}}`
	userMessageEnd = `{"type":"message_end","message":{"role":"user","content":[{"type":"text","text":"hi"}]}}`
	piStats        = `{"sessionId":"x","userMessages":2,"assistantMessages":3,"tokens":{"input":900,"output":9,"cacheRead":898,"cacheWrite":0,"total":1807},"cost":0.0031043999999999998}`

	ompACPUpdate    = `{"sessionUpdate":"usage_update","size":1000000,"used":4601,"cost":{"amount":0.0152916,"currency":"USD"}}`
	ompACPAnswer    = `{"stopReason":"end_turn","usage":{"inputTokens":4593,"outputTokens":9,"totalTokens":9194,"cachedReadTokens":4592}}`
	claudeNoCost    = `{"sessionUpdate":"usage_update","used":4052,"size":1000000,"_meta":{"_claude/model":"claude-opus-5-5"}}`
	claudeACPUpdate = `{"sessionUpdate":"usage_update","used":4076,"size":1000000,"cost":{"amount":0.021711799999999996,"currency":"USD"}}`
	claudeACPAnswer = `{"stopReason":"end_turn","usage":{"inputTokens":2034,"outputTokens":17,"cachedReadTokens":4062,"cachedWriteTokens":2030,"totalTokens":8143},` +
		`"_meta":{"quota":{"token_count":{"totalTokens":8143,"inputTokens":2034,"cachedInputTokens":4062,"cachedWriteTokens":2030,"outputTokens":17}}}}`
	codexACPAnswer    = `{"stopReason":"end_turn","usage":{"totalTokens":12205,"inputTokens":6089,"cachedReadTokens":6087,"cachedWriteTokens":0,"outputTokens":29,"thoughtTokens":0}}`
	copilotACPAnswer1 = `{"stopReason":"end_turn","usage":{"inputTokens":11050,"outputTokens":25,"totalTokens":11075,"cachedReadTokens":5525,"cachedWriteTokens":0}}`
	copilotACPAnswer2 = `{"stopReason":"end_turn","usage":{"inputTokens":16613,"outputTokens":28,"totalTokens":16641,"cachedReadTokens":8306,"cachedWriteTokens":0}}`
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12+1e-9*math.Abs(b) }

func sameUsage(got, want usage.Usage) bool {
	g, w := got, want
	g.CostUSD, w.CostUSD = 0, 0
	return g == w && near(got.CostUSD, want.CostUSD)
}

func TestRPCTurn_Frame(t *testing.T) {
	var turn usage.RPCTurn
	for _, f := range []string{userMessageEnd, `{"type":"message_update","message":{"role":"assistant"}}`, ompMessageEnd, ompMessageEnd} {
		if err := turn.Frame([]byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	want := usage.Usage{InputTokens: 4594, OutputTokens: 2, CacheReadTokens: 4592, CostUSD: 2 * 0.0075948000000000005}
	if got := turn.Usage(); !sameUsage(got, want) || turn.Messages() != 2 {
		t.Errorf("turn = %+v over %d messages, want %+v over 2", got, turn.Messages(), want)
	}
	bad := `{"type":"message_end","message":{"role":"assistant","usage":{"input":-3}}}`
	if err := turn.Frame([]byte(bad)); !errors.Is(err, usage.ErrBadReport) {
		t.Errorf("negative count: %v, want ErrBadReport", err)
	}
	if err := turn.Frame([]byte(`not json`)); !errors.Is(err, usage.ErrBadReport) {
		t.Errorf("not JSON: %v, want ErrBadReport", err)
	}
	if turn.Messages() != 2 {
		t.Error("a bad frame was counted")
	}
}

func TestFromRPCStats(t *testing.T) {
	got, err := usage.FromRPCStats([]byte(piStats))
	want := usage.Usage{InputTokens: 900, OutputTokens: 9, CacheReadTokens: 898, CostUSD: 0.0031044}
	if err != nil || !sameUsage(got, want) {
		t.Errorf("FromRPCStats = %+v, %v; want %+v", got, err, want)
	}
}

func TestACPSession_PerTurnWithCost(t *testing.T) {
	// omp acp: per-turn tokens, the cost as the session's running total.
	s := usage.NewACPSession(usage.ACPReportOf("omp"), 0)
	mustUpdate(t, s, ompACPUpdate)
	u, ok, err := s.EndTurn([]byte(ompACPAnswer))
	want := usage.Usage{InputTokens: 4593, OutputTokens: 9, CacheReadTokens: 4592, CostUSD: 0.0152916}
	if err != nil || !ok || !sameUsage(u, want) {
		t.Fatalf("turn 1 = %+v %v %v, want %+v", u, ok, err, want)
	}
	mustUpdate(t, s, `{"sessionUpdate":"usage_update","size":1000000,"used":4605,"cost":{"amount":0.0229362,"currency":"USD"}}`)
	u, _, _ = s.EndTurn([]byte(`{"stopReason":"end_turn","usage":{"inputTokens":2303,"outputTokens":3,"totalTokens":4608,"cachedReadTokens":2302}}`))
	want = usage.Usage{InputTokens: 2303, OutputTokens: 3, CacheReadTokens: 2302, CostUSD: 0.0229362 - 0.0152916}
	if !sameUsage(u, want) {
		t.Errorf("turn 2 = %+v, want %+v", u, want)
	}
	if !near(s.SessionCost(), 0.0229362) {
		t.Errorf("SessionCost = %v", s.SessionCost())
	}
	// A new process on the loaded session resumes the total: the first turn costs what it added.
	s2 := usage.NewACPSession(usage.ACPReportOf("omp"), s.SessionCost())
	mustUpdate(t, s2, `{"sessionUpdate":"usage_update","size":1000000,"used":4605,"cost":{"amount":0.0305727,"currency":"USD"}}`)
	u, _, _ = s2.EndTurn([]byte(`{"stopReason":"end_turn","usage":{"inputTokens":2305,"outputTokens":2,"cachedReadTokens":2305}}`))
	if !near(u.CostUSD, 0.0305727-0.0229362) {
		t.Errorf("first turn after a load costs %v, want %v", u.CostUSD, 0.0305727-0.0229362)
	}
}

func TestACPSession_Claude(t *testing.T) {
	s := usage.NewACPSession(usage.ACPReportOf("claude"), 0)
	mustUpdate(t, s, claudeNoCost)
	mustUpdate(t, s, `{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"done"}}`)
	mustUpdate(t, s, claudeACPUpdate)
	u, ok, err := s.EndTurn([]byte(claudeACPAnswer))
	want := usage.Usage{InputTokens: 2034, OutputTokens: 17, CacheReadTokens: 4062, CacheWriteTokens: 2030, CostUSD: 0.021711799999999996}
	if err != nil || !ok || !sameUsage(u, want) {
		t.Errorf("turn = %+v %v %v, want %+v", u, ok, err, want)
	}
}

func TestACPSession_Codex(t *testing.T) {
	s := usage.NewACPSession(usage.ACPReportOf("codex"), 0)
	mustUpdate(t, s, `{"sessionUpdate":"usage_update","used":6089,"size":258400}`)
	u, ok, err := s.EndTurn([]byte(codexACPAnswer))
	want := usage.Usage{InputTokens: 6089, OutputTokens: 29, CacheReadTokens: 6087}
	if err != nil || !ok || u != want {
		t.Errorf("turn = %+v %v %v, want %+v", u, ok, err, want)
	}
}

func TestACPSession_CopilotRunningTotal(t *testing.T) {
	s := usage.NewACPSession(usage.ACPReportOf("copilot"), 0)
	u, ok, err := s.EndTurn([]byte(copilotACPAnswer1))
	want := usage.Usage{InputTokens: 11050 - 5525, OutputTokens: 25, CacheReadTokens: 5525}
	if err != nil || !ok || u != want {
		t.Fatalf("turn 1 = %+v %v %v, want %+v", u, ok, err, want)
	}
	u, _, _ = s.EndTurn([]byte(copilotACPAnswer2))
	want = usage.Usage{InputTokens: (16613 - 8306) - (11050 - 5525), OutputTokens: 3, CacheReadTokens: 8306 - 5525}
	if u != want {
		t.Errorf("turn 2 = %+v, want %+v", u, want)
	}
	// A total that went down started over: all of it is the turn's.
	u, _, _ = s.EndTurn([]byte(`{"stopReason":"end_turn","usage":{"inputTokens":100,"outputTokens":2,"cachedReadTokens":40}}`))
	if want := (usage.Usage{InputTokens: 60, OutputTokens: 2, CacheReadTokens: 40}); u != want {
		t.Errorf("after a restart = %+v, want %+v", u, want)
	}
}

func TestACPSession_Unreported(t *testing.T) {
	s := usage.NewACPSession(usage.ACPReport{}, 0)
	u, ok, err := s.EndTurn([]byte(`{"stopReason":"end_turn"}`))
	if err != nil || ok || !u.IsZero() {
		t.Errorf("an answer without usage = %+v %v %v, want nothing reported", u, ok, err)
	}
	// Only the _meta token count (an adapter without ACP's usage field): taken.
	u, ok, _ = s.EndTurn([]byte(`{"stopReason":"end_turn","_meta":{"quota":{"token_count":{"inputTokens":5,"cachedInputTokens":3,"cacheWriteInputTokens":2,"outputTokens":1}}}}`))
	if want := (usage.Usage{InputTokens: 5, OutputTokens: 1, CacheReadTokens: 3, CacheWriteTokens: 2}); !ok || u != want {
		t.Errorf("_meta only = %+v %v, want %+v", u, ok, want)
	}
}

func TestACPSession_BadReports(t *testing.T) {
	s := usage.NewACPSession(usage.ACPReport{}, 0)
	for _, bad := range []string{
		`{"sessionUpdate":"usage_update","cost":{"amount":-1,"currency":"USD"}}`,
		`{"sessionUpdate":"usage_update","cost":{"amount":"a lot","currency":"USD"}}`,
		`[1,2]`,
	} {
		if err := s.Update([]byte(bad)); !errors.Is(err, usage.ErrBadReport) {
			t.Errorf("Update(%s) = %v, want ErrBadReport", bad, err)
		}
	}
	// Another currency is no dollar cost.
	mustUpdate(t, s, `{"sessionUpdate":"usage_update","cost":{"amount":5,"currency":"EUR"}}`)
	mustUpdate(t, s, `{"sessionUpdate":"usage_update","cost":{"amount":0.5,"currency":"USD"}}`)
	u, ok, err := s.EndTurn([]byte(`{"usage":{"inputTokens":1.5}}`))
	if !errors.Is(err, usage.ErrBadReport) || !ok || u.CostUSD != 0.5 || u.InputTokens != 0 {
		t.Errorf("a bad answer = %+v %v %v, want the cost kept and ErrBadReport", u, ok, err)
	}
	// The cost went to that turn, not the next.
	if u, _, _ := s.EndTurn([]byte(`{}`)); u.CostUSD != 0 {
		t.Errorf("the next turn costs %v", u.CostUSD)
	}
}

func TestACPAnswer(t *testing.T) {
	type sdkUsage struct {
		InputTokens      int  `json:"inputTokens"`
		OutputTokens     int  `json:"outputTokens"`
		CachedReadTokens *int `json:"cachedReadTokens,omitempty"`
	}
	three := 3
	b, err := usage.ACPAnswer(&sdkUsage{InputTokens: 7, OutputTokens: 2, CachedReadTokens: &three}, map[string]any{"x": 1})
	if err != nil {
		t.Fatal(err)
	}
	u, ok, err := usage.NewACPSession(usage.ACPReport{}, 0).EndTurn(b)
	if want := (usage.Usage{InputTokens: 7, OutputTokens: 2, CacheReadTokens: 3}); err != nil || !ok || u != want {
		t.Errorf("EndTurn(ACPAnswer) = %+v %v %v, want %+v", u, ok, err, want)
	}
	var none *sdkUsage
	b, _ = usage.ACPAnswer(none, nil)
	if _, ok, err := usage.NewACPSession(usage.ACPReport{}, 0).EndTurn(b); ok || err != nil {
		t.Errorf("EndTurn(ACPAnswer(nil)) = %v %v, want nothing reported", ok, err)
	}
}

func mustUpdate(t *testing.T, s *usage.ACPSession, u string) {
	t.Helper()
	if err := s.Update([]byte(u)); err != nil {
		t.Fatalf("Update(%s): %v", u, err)
	}
}
