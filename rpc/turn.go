package rpc

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Turn is a prompt's run to its end.
type Turn struct {
	// Events are the frames received during the turn, in order, bounded by
	// Options.RetainedTurnBytes; DroppedEvents counts those not kept.
	Events        []Event
	DroppedEvents int
	// Messages are the messages that ended during the turn (message_end).
	Messages []Message
	// Text is the final assistant message's text.
	Text string
	// StopReason is the final assistant message's stop reason ("stop",
	// "toolUse", "aborted", "error", ...).
	StopReason string
	// ErrorMessage is the final assistant message's error, if any.
	ErrorMessage string
	// Usage sums the assistant messages' usage.
	Usage Usage
	// AgentInvoked is false for omp's local-only slash commands.
	AgentInvoked bool
	// Started and Ended bound the turn on the host's clock.
	Started, Ended time.Time
}

type turnState struct {
	promptIDs []string
	// starts counts the agent runs still expected to begin (agent_start);
	// the turn ends at a terminal agent_end once none is outstanding, so a
	// stale agent_end from an aborted run never ends a new turn.
	starts   int
	retained int
	result   Turn
	err      error
	done     chan struct{}
	settled  bool
	waiting  bool
	// probing: a non-terminal or failed agent_end was seen and get_state
	// is being polled to learn whether the agent settled; confirmIdle is
	// how many consecutive idle answers (250 ms apart) settle the turn.
	probing     bool
	confirmIdle int
}

// PromptOptions adjust a prompt.
type PromptOptions struct {
	Images []ImageContent
	// StreamingBehavior ("steer" or "followUp") queues the prompt into a
	// running turn instead of starting one (omp).
	StreamingBehavior string
}

// Prompt sends a prompt and returns once the agent acknowledged it. The
// turn it starts runs on; WaitTurn waits for its end. While a turn runs, a
// prompt without StreamingBehavior fails with ErrTurnInProgress.
func (c *Client) Prompt(ctx context.Context, message string, opts *PromptOptions) error {
	cmd := PromptCommand{Message: message}
	if opts != nil {
		cmd.Images, cmd.StreamingBehavior = opts.Images, opts.StreamingBehavior
	}
	if cmd.StreamingBehavior != "" {
		_, err := c.Request(ctx, cmd.CommandType(), cmd)
		return err
	}
	return c.startTurn(ctx, cmd.CommandType(), cmd, false)
}

// AbortAndPrompt aborts the running work and prompts at once (omp). The
// running turn, if any, continues as this prompt's turn; without one, a new
// turn starts.
func (c *Client) AbortAndPrompt(ctx context.Context, message string, images []ImageContent) error {
	cmd := AbortAndPromptCommand{Message: message, Images: images}
	return c.startTurn(ctx, cmd.CommandType(), cmd, true)
}

func (c *Client) startTurn(ctx context.Context, typ string, cmd Command, replace bool) error {
	id := c.newID()
	line, err := encodeCommand(id, typ, cmd)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if err := c.usableLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	t := c.turn
	switch {
	case t != nil && !t.settled && !replace:
		c.mu.Unlock()
		return ErrTurnInProgress
	case t != nil && !t.settled && replace:
		t.starts++
		t.promptIDs = append(t.promptIDs, id)
	default:
		t = &turnState{promptIDs: []string{id}, starts: 1, done: make(chan struct{})}
		t.result.Started = time.Now()
		t.result.AgentInvoked = true
		c.turn = t
	}
	c.mu.Unlock()

	resp, err := c.roundTrip(ctx, id, typ, line)
	if err != nil {
		if resp != nil && !replace {
			c.settleTurn(t, fmt.Errorf("%w: %w", ErrPromptFailed, err))
			return fmt.Errorf("%w: %w", ErrPromptFailed, err)
		}
		if !replace {
			c.settleTurn(t, err)
		}
		return err
	}
	// omp answers a consumed local command with agentInvoked:false.
	var d struct {
		AgentInvoked *bool `json:"agentInvoked"`
	}
	if len(resp.Data) > 0 && json.Unmarshal(resp.Data, &d) == nil && d.AgentInvoked != nil && !*d.AgentInvoked {
		c.mu.Lock()
		t.result.AgentInvoked = false
		c.mu.Unlock()
		c.settleTurn(t, nil)
	}
	return nil
}

// WaitTurn waits for the current turn to end and returns it. Only one
// caller may wait at a time (ErrConcurrentWait otherwise). If ctx ends
// first, WaitTurn returns ctx's error and the turn keeps running; Run is
// the call that also aborts it.
func (c *Client) WaitTurn(ctx context.Context) (*Turn, error) {
	c.mu.Lock()
	t := c.turn
	if t == nil {
		c.mu.Unlock()
		return nil, ErrNoTurn
	}
	if t.waiting {
		c.mu.Unlock()
		return nil, ErrConcurrentWait
	}
	t.waiting = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		t.waiting = false
		c.mu.Unlock()
	}()
	select {
	case <-t.done:
		c.mu.Lock()
		res, err := t.result, t.err
		c.mu.Unlock()
		return &res, err
	case <-ctx.Done():
		return nil, fmt.Errorf("rpc: waiting for the turn: %w", ctx.Err())
	}
}

// Run prompts and waits for the turn's end. If ctx ends first the turn is
// aborted (best effort, within a second) and ctx's error is returned with
// whatever the turn collected.
func (c *Client) Run(ctx context.Context, message string, opts *PromptOptions) (*Turn, error) {
	if opts != nil && opts.StreamingBehavior != "" {
		return nil, fmt.Errorf("rpc: Run starts a turn; use Prompt with StreamingBehavior to queue into one")
	}
	if err := c.Prompt(ctx, message, opts); err != nil {
		return nil, err
	}
	turn, err := c.WaitTurn(ctx)
	if err != nil && ctx.Err() != nil {
		c.mu.Lock()
		t := c.turn
		c.mu.Unlock()
		actx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.Abort(actx)
		cancel()
		if t != nil {
			c.settleTurn(t, fmt.Errorf("rpc: turn: %w", ctx.Err()))
			c.mu.Lock()
			res := t.result
			c.mu.Unlock()
			return &res, fmt.Errorf("rpc: turn: %w", ctx.Err())
		}
	}
	return turn, err
}

// Steer queues a message into the running turn, delivered after the current
// tool calls.
func (c *Client) Steer(ctx context.Context, message string, images []ImageContent) error {
	return c.Call(ctx, SteerCommand{Message: message, Images: images}, nil)
}

// FollowUp queues a message delivered once the agent would otherwise stop;
// the running turn goes on through it.
func (c *Client) FollowUp(ctx context.Context, message string, images []ImageContent) error {
	return c.Call(ctx, FollowUpCommand{Message: message, Images: images}, nil)
}

// Abort stops the running turn; the turn then ends with the agent's
// agent_end (stop reason "aborted").
func (c *Client) Abort(ctx context.Context) error {
	return c.Call(ctx, AbortCommand{}, nil)
}

// WaitForIdle returns once the agent reports it is not streaming and has
// nothing queued. It re-checks at each agent_end, and at most every 250 ms.
func (c *Client) WaitForIdle(ctx context.Context) error {
	ends := make(chan struct{}, 1)
	unsub := c.On(EventAgentEnd, func(Event) {
		select {
		case ends <- struct{}{}:
		default:
		}
	})
	defer unsub()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := c.GetState(ctx)
		if err != nil {
			return err
		}
		if !st.IsStreaming && st.Queued() == 0 {
			return nil
		}
		select {
		case <-ends:
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("rpc: waiting for idle: %w", ctx.Err())
		case <-c.done:
			return c.transportErr()
		}
	}
}

// trackTurn records a frame into the running turn and ends the turn on its
// terminal frame. It may set ev.raw to the retained copy, which listeners
// then share (an Event cannot be mutated).
func (c *Client) trackTurn(typ string, line []byte, ev *Event) {
	c.mu.Lock()
	t := c.turn
	if t == nil || t.settled {
		c.mu.Unlock()
		return
	}
	if t.retained+len(line) <= c.opts.RetainedTurnBytes {
		ev.raw = frameRef(line)
		t.result.Events = append(t.result.Events, *ev)
		t.retained += len(line)
	} else {
		t.result.DroppedEvents++
	}
	settle := false
	switch typ {
	case EventAgentStart:
		if t.starts > 0 {
			t.starts--
		}
		t.probing = false
	case EventMessageEnd:
		var m MessageEndEvent
		if json.Unmarshal(line, &m) == nil {
			t.result.Messages = append(t.result.Messages, m.Message)
			if m.Message.Role == "assistant" {
				t.result.Text = m.Message.Text()
				t.result.StopReason = m.Message.StopReason
				t.result.ErrorMessage = m.Message.ErrorMessage
				if m.Message.Usage != nil {
					t.result.Usage.add(m.Message.Usage)
				}
			}
		}
	case EventAgentEnd:
		var e struct {
			IsTerminal *bool `json:"isTerminal"`
		}
		_ = json.Unmarshal(line, &e)
		errored := t.result.StopReason == StopReasonError
		switch {
		case t.starts > 0:
			// a stale end, or one run of several still to start
		case (e.IsTerminal == nil || *e.IsTerminal) && !errored:
			settle = true
		case !t.probing:
			// omp marks an agent_end non-terminal when more may follow
			// (auto-compaction) and has been seen to send no terminal one
			// after it; pi sends a failed run's agent_end before it decides
			// to retry (auto_retry_start). Ask the agent whether it settled.
			t.probing = true
			t.confirmIdle = 1
			if errored {
				t.confirmIdle = 2
			}
			c.wg.Add(1)
			go c.probeSettled(t)
		}
	case EventAutoRetryStart:
		// A retry run follows; it will start with its own agent_start.
		t.probing = false
		t.starts++
	case EventAutoRetryEnd:
		var e struct {
			Success bool `json:"success"`
		}
		if json.Unmarshal(line, &e) == nil && !e.Success && t.starts == 0 {
			settle = true
		}
	case EventPromptResult:
		var e PromptResultEvent
		if json.Unmarshal(line, &e) == nil && !e.AgentInvoked && slices.Contains(t.promptIDs, e.ID) {
			t.result.AgentInvoked = false
			settle = true
		}
	}
	c.mu.Unlock()
	if settle {
		c.settleTurn(t, nil)
	}
}

// probeSettled polls get_state after a non-terminal or failed agent_end
// until the agent is idle with nothing queued (the turn settles), a new run
// or a retry starts, or the turn ends otherwise. No event announces that
// state, hence the poll.
func (c *Client) probeSettled(t *turnState) {
	defer c.wg.Done()
	ctx, cancel := c.lifetimeCtx()
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	idle := 0
	for {
		c.mu.Lock()
		live := t.probing && !t.settled
		c.mu.Unlock()
		if !live {
			return
		}
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := c.GetState(qctx)
		qcancel()
		if err == nil && !st.IsStreaming && !st.IsCompacting && st.Queued() == 0 {
			idle++
			c.mu.Lock()
			still, need := t.probing, t.confirmIdle
			c.mu.Unlock()
			if !still {
				return
			}
			if idle >= need {
				c.settleTurn(t, nil)
				return
			}
		} else {
			idle = 0
		}
		select {
		case <-tick.C:
		case <-t.done:
			return
		case <-ctx.Done():
			return
		}
	}
}

// failTurn ends the running turn, if any, with err.
func (c *Client) failTurn(err error) {
	c.mu.Lock()
	t := c.turn
	c.mu.Unlock()
	if t != nil {
		c.settleTurn(t, err)
	}
}

func (c *Client) settleTurn(t *turnState, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.settled {
		return
	}
	t.settled = true
	t.err = err
	t.result.Ended = time.Now()
	close(t.done)
}
