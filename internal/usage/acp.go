package usage

import "encoding/json"

// ACPReport says how one ACP agent counts the usage in its session/prompt answers (ACP's
// unstable "usage": inputTokens, outputTokens, cachedReadTokens, cachedWriteTokens). The zero
// value is what most agents do: the turn's own counts, inputTokens without the cached part.
type ACPReport struct {
	// RunningTotal: the answer's usage is the agent process's total so far, not the turn's
	// (copilot; it starts from zero in each new process, even on a loaded session).
	RunningTotal bool
	// InputIncludesCache: inputTokens counts the cache reads and writes too (copilot).
	InputIncludesCache bool
}

// ACPReportOf returns how the ACP agent of kind ("omp", "claude", "codex", "copilot", as
// internal/agents names them) reports usage; any other kind gets the zero ACPReport.
func ACPReportOf(kind string) ACPReport {
	if kind == "copilot" {
		return ACPReport{RunningTotal: true, InputIncludesCache: true}
	}
	return ACPReport{}
}

// ACPSession follows one ACP session in one agent process and gives each turn its usage: the
// tokens from session/prompt's answer (as ACPReport says to read them) and the cost from the
// usage_update notifications, whose cost is the session's running total (omp and claude carry
// it over when a session is loaded into a new process). Create one per agent process and
// session; it is not safe for concurrent use.
type ACPSession struct {
	report ACPReport
	total  Usage // the previous answer's counts, for RunningTotal
	// cost is the session's total cost as last reported; turnBase what it was when the
	// previous turn ended. costSeen: a usage_update with a cost arrived since then.
	cost, turnBase float64
	costSeen       bool
}

// NewACPSession starts following a session. sessionCost is the session's total cost as last
// reported (SessionCost of the ACPSession that followed it in an earlier process, kept with the
// session), 0 for a new session: an agent that resumes the total on session/load then charges
// the first turn only what it added.
func NewACPSession(r ACPReport, sessionCost float64) *ACPSession {
	return &ACPSession{report: r, cost: sessionCost, turnBase: sessionCost}
}

// acpUpdate is the part of a session/update's update object the session reads.
type acpUpdate struct {
	Kind string `json:"sessionUpdate"`
	Cost *struct {
		Amount   money  `json:"amount"`
		Currency string `json:"currency"`
	} `json:"cost"`
}

// Update takes one session/update's update object (acp.Event.Raw). Only usage_update with a
// cost in USD counts; every other update is ignored. An unreadable usage_update is an
// ErrBadReport and changes nothing.
func (s *ACPSession) Update(update []byte) error {
	var u acpUpdate
	if err := decode("acp session/update", update, &u); err != nil {
		return err
	}
	if u.Kind != "usage_update" || u.Cost == nil || u.Cost.Currency != "USD" {
		return nil
	}
	s.cost = float64(u.Cost.Amount)
	s.costSeen = true
	return nil
}

// acpTokens are ACP's usage fields; the _meta.quota.token_count some adapters add (claude's,
// codex's) names cache reads cachedInputTokens and cache writes either way.
type acpTokens struct {
	InputTokens       count  `json:"inputTokens"`
	OutputTokens      count  `json:"outputTokens"`
	CachedReadTokens  *count `json:"cachedReadTokens"`
	CachedInputTokens *count `json:"cachedInputTokens"`
	CachedWriteTokens *count `json:"cachedWriteTokens"`
	CacheWriteInput   *count `json:"cacheWriteInputTokens"`
}

func (a acpTokens) usage() Usage {
	val := func(cs ...*count) int64 {
		for _, c := range cs {
			if c != nil {
				return int64(*c)
			}
		}
		return 0
	}
	return Usage{InputTokens: int64(a.InputTokens), OutputTokens: int64(a.OutputTokens),
		CacheReadTokens:  val(a.CachedReadTokens, a.CachedInputTokens),
		CacheWriteTokens: val(a.CachedWriteTokens, a.CacheWriteInput)}
}

// EndTurn takes session/prompt's answer ({"stopReason", "usage", "_meta"}, as the agent sent
// it; acp.Result's Usage and Meta encode to it) and returns the turn's usage. reported is false
// when the agent reported neither tokens nor a cost for the turn. An unreadable answer is an
// ErrBadReport; the turn's cost is still returned then.
func (s *ACPSession) EndTurn(answer []byte) (u Usage, reported bool, err error) {
	// The cost first, so that a bad usage object does not carry this turn's cost into the next.
	cost := s.cost - s.turnBase
	if cost < 0 {
		// The agent's total started over (a new session under the same id): all of it is new.
		cost = s.cost
	}
	reported = s.costSeen
	s.turnBase, s.costSeen = s.cost, false

	var a struct {
		Usage *acpTokens `json:"usage"`
		Meta  struct {
			Quota struct {
				TokenCount *acpTokens `json:"token_count"`
			} `json:"quota"`
		} `json:"_meta"`
	}
	if err := decode("acp session/prompt answer", answer, &a); err != nil {
		return Usage{CostUSD: cost}, reported, err
	}
	tokens := a.Usage
	if tokens == nil {
		tokens = a.Meta.Quota.TokenCount
	}
	if tokens != nil {
		reported = true
		u = tokens.usage()
		if s.report.InputIncludesCache {
			u.InputTokens = max(0, u.InputTokens-u.CacheReadTokens-u.CacheWriteTokens)
		}
		if s.report.RunningTotal {
			total := u
			u = Usage{InputTokens: total.InputTokens - s.total.InputTokens, OutputTokens: total.OutputTokens - s.total.OutputTokens,
				CacheReadTokens: total.CacheReadTokens - s.total.CacheReadTokens, CacheWriteTokens: total.CacheWriteTokens - s.total.CacheWriteTokens}
			if u.InputTokens < 0 || u.OutputTokens < 0 || u.CacheReadTokens < 0 || u.CacheWriteTokens < 0 {
				u = total // the total started over
			}
			s.total = total
		}
	}
	u.CostUSD = cost
	return u, reported, nil
}

// SessionCost is the session's total cost as the agent last reported it: keep it with the
// session for the NewACPSession of a later process that loads it.
func (s *ACPSession) SessionCost() float64 { return s.cost }

// ACPAnswer encodes what acp.Result holds of session/prompt's answer (its Usage and Meta, any
// JSON-encodable values) into the form EndTurn reads.
func ACPAnswer(usage any, meta map[string]any) ([]byte, error) {
	return json.Marshal(struct {
		Usage any            `json:"usage,omitempty"`
		Meta  map[string]any `json:"_meta,omitempty"`
	}{usage, meta})
}
