// Package usage turns the token usage and cost each agent path reports into one shape per turn:
// omp and pi over RPC (per assistant message, and session totals), and the ACP agents (omp acp,
// claude-agent-acp, codex-acp, copilot --acp: the usage of session/prompt's answer and the cost
// of usage_update notifications). It reads the agents' JSON as sent and depends on the standard
// library and package record only, so every transport and rooms can use it.
//
// What each path reports, measured with the pinned versions on the built-in model:
//
//	path         tokens                                            cache write  cost
//	omp rpc      message_end usage per assistant message           yes          yes (registered price)
//	pi rpc       message_end usage per assistant message           yes          yes (registered price)
//	omp acp      session/prompt usage, per turn                    no field     usage_update, session total
//	claude acp   session/prompt usage, per turn (title requests    yes          usage_update, session total
//	             left out)                                                      (Claude Code's own price)
//	codex acp    session/prompt usage, per turn                    yes (0)      none
//	copilot acp  session/prompt usage, the process's running        yes (0)      none
//	             total; inputTokens includes cached tokens
package usage

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/agenthost/agenthost/record"
)

// Usage is the tokens and cost of a turn (or a sum of turns): record.Usage, which rooms store.
type Usage = record.Usage

// ErrBadReport means an agent's usage report could not be read (the message says which).
var ErrBadReport = errors.New("usage: unreadable usage report")

// count is a token count as an agent sent it: a JSON number that must be a non-negative integer
// (some agents send 12.0).
type count int64

func (c *count) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*c = 0
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	if f < 0 || f != math.Trunc(f) || f > math.MaxInt64/2 {
		return fmt.Errorf("token count %v is not a non-negative integer", f)
	}
	*c = count(f)
	return nil
}

// money is a cost as an agent sent it: a finite, non-negative JSON number.
type money float64

func (m *money) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*m = 0
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	if f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return fmt.Errorf("cost %v is not a non-negative number", f)
	}
	*m = money(f)
	return nil
}

func decode(what string, data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadReport, what, err)
	}
	return nil
}
