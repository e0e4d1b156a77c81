package usage

import "encoding/json"

// rpcUsage is omp's and pi's usage of one assistant message: input without the cached part, as
// the pi-ai providers normalise every API's counts, and cost in the model's price (dollars for
// the models agenthost registers).
type rpcUsage struct {
	Input      count `json:"input"`
	Output     count `json:"output"`
	CacheRead  count `json:"cacheRead"`
	CacheWrite count `json:"cacheWrite"`
	Cost       struct {
		Total money `json:"total"`
	} `json:"cost"`
}

func (r rpcUsage) usage() Usage {
	return Usage{InputTokens: int64(r.Input), OutputTokens: int64(r.Output), CacheReadTokens: int64(r.CacheRead),
		CacheWriteTokens: int64(r.CacheWrite), CostUSD: float64(r.Cost.Total)}
}

// FromRPC reads the usage object of an omp or pi assistant message (message_end's
// message.usage: {"input", "output", "cacheRead", "cacheWrite", "totalTokens", "cost": {...,
// "total"}}).
func FromRPC(usage []byte) (Usage, error) {
	var r rpcUsage
	if err := decode("rpc message usage", usage, &r); err != nil {
		return Usage{}, err
	}
	return r.usage(), nil
}

// FromRPCStats reads omp's or pi's get_session_stats answer ({"tokens": {"input", "output",
// "cacheRead", "cacheWrite", ...}, "cost"}): the session's totals so far.
func FromRPCStats(stats []byte) (Usage, error) {
	var s struct {
		Tokens struct {
			Input      count `json:"input"`
			Output     count `json:"output"`
			CacheRead  count `json:"cacheRead"`
			CacheWrite count `json:"cacheWrite"`
		} `json:"tokens"`
		Cost money `json:"cost"`
	}
	if err := decode("get_session_stats", stats, &s); err != nil {
		return Usage{}, err
	}
	return Usage{InputTokens: int64(s.Tokens.Input), OutputTokens: int64(s.Tokens.Output),
		CacheReadTokens: int64(s.Tokens.CacheRead), CacheWriteTokens: int64(s.Tokens.CacheWrite), CostUSD: float64(s.Cost)}, nil
}

// RPCTurn sums a turn's usage from the frames omp or pi sent during it: each assistant
// message's message_end carries that message's usage (a turn with tool calls has several). The
// zero value is ready; it is not safe for concurrent use.
type RPCTurn struct {
	sum      Usage
	messages int
}

// Frame takes one frame of the turn; only message_end frames of assistant messages count, every
// other frame is ignored. A message_end whose usage cannot be read is an ErrBadReport and adds
// nothing.
func (t *RPCTurn) Frame(frame []byte) error {
	var f struct {
		Type    string `json:"type"`
		Message *struct {
			Role  string          `json:"role"`
			Usage json.RawMessage `json:"usage"`
		} `json:"message"`
	}
	if err := decode("rpc frame", frame, &f); err != nil {
		return err
	}
	if f.Type != "message_end" || f.Message == nil || f.Message.Role != "assistant" || len(f.Message.Usage) == 0 {
		return nil
	}
	u, err := FromRPC(f.Message.Usage)
	if err != nil {
		return err
	}
	t.sum = t.sum.Add(u)
	t.messages++
	return nil
}

// Usage is the turn's usage so far.
func (t *RPCTurn) Usage() Usage { return t.sum }

// Messages is how many assistant messages reported usage.
func (t *RPCTurn) Messages() int { return t.messages }
