package modelsim

// The token usage every answer reports, a deterministic function of the request and the answer
// so that tests can compute exact counts (see [Usage]).

// Usage is the token usage one answer reported, in the normalised form the agents use: Input
// counts only the prompt tokens that were neither read from nor written to the cache, so the
// whole prompt is Input+CacheRead+CacheWrite. [Request.Usage] holds it for each answered
// request.
//
// The formula, the same on every API:
//
//   - prompt bytes P: the bytes of every message's text in the normalised conversation
//     ([Request.Messages], the system prompt included) plus, for each tool call an assistant
//     message made, the bytes of its name and arguments;
//   - prompt tokens T = max(P/4, 1) (a token is 4 bytes; integer division);
//   - Output = max(A/4, 1), A the bytes of the answer's text plus each tool call's name and
//     arguments;
//   - CacheRead = T/2: half the prompt is reported as a cache hit;
//   - CacheWrite = T/4 on the Anthropic Messages API, 0 on the OpenAI APIs (which have no
//     standard field for it);
//   - Input = T - CacheRead - CacheWrite.
//
// On the wire: chat completions report prompt_tokens T, prompt_tokens_details.cached_tokens
// CacheRead, completion_tokens Output, total_tokens T+Output (the last streamed chunk, with
// no choices); the Responses API reports input_tokens T, input_tokens_details.cached_tokens
// CacheRead, output_tokens Output and total_tokens in response.completed; the Messages API
// reports input_tokens Input, cache_read_input_tokens CacheRead, cache_creation_input_tokens
// CacheWrite in message_start (output_tokens 1 there, as Anthropic does) and output_tokens
// Output in message_delta. /v1/messages/count_tokens answers input_tokens T.
type Usage struct {
	Input      int
	Output     int
	CacheRead  int
	CacheWrite int
}

// Prompt is every prompt token: Input + CacheRead + CacheWrite.
func (u Usage) Prompt() int { return u.Input + u.CacheRead + u.CacheWrite }

// Add returns the sum of u and o.
func (u Usage) Add(o Usage) Usage {
	return Usage{Input: u.Input + o.Input, Output: u.Output + o.Output,
		CacheRead: u.CacheRead + o.CacheRead, CacheWrite: u.CacheWrite + o.CacheWrite}
}

// promptTokens is T of the formula: the request's prompt at 4 bytes a token, at least 1.
func promptTokens(req Request) int {
	n := 0
	for _, m := range req.Messages {
		n += len(m.Content)
		for _, c := range m.ToolCalls {
			n += len(c.Name) + len(c.Arguments)
		}
	}
	return max(n/4, 1)
}

// answerUsage is the usage of answering req with p; cacheWrite says whether the API can report
// cache writes (Anthropic's).
func answerUsage(req Request, p plan, cacheWrite bool) Usage {
	t := promptTokens(req)
	out := len(p.text)
	for _, c := range p.calls {
		out += len(c.name) + len(c.args)
	}
	u := Usage{Output: max(out/4, 1), CacheRead: t / 2}
	if cacheWrite {
		u.CacheWrite = t / 4
	}
	u.Input = t - u.CacheRead - u.CacheWrite
	return u
}
