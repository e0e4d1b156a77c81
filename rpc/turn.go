package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Turn is a prompt's run to its end.
type Turn struct {
	// Events are the frames received during the turn, in order, bounded by
	// Options.RetainedTurnBytes; DroppedEvents counts those not kept. They
	// are copies: a Turn kept for long pins no read buffer.
	Events        []Event
	DroppedEvents int
	// Messages are the messages that ended during the turn (message_end),
	// bounded with Events by Options.RetainedTurnBytes (a message costs its
	// frame's size); DroppedMessages counts those not kept.
	Messages        []Message
	DroppedMessages int
	// Text is the final assistant message's text.
	Text string
	// StopReason is the final assistant message's stop reason ("stop",
	// "toolUse", "aborted", "error", ...).
	StopReason string
	// ErrorMessage is the final assistant message's error, if any.
	ErrorMessage string
	// Usage sums the assistant messages' usage.
	Usage Usage
	// AgentInvoked is false when the prompt started no run: omp's
	// local-only slash commands, a prompt an extension command consumed, a
	// prompt aborted before its run began.
	AgentInvoked bool
	// Unsolicited: the run was not started by this client's Prompt, Run or
	// AbortAndPrompt: the agent began it on its own (omp, when a background
	// job completes) or on a steer or follow-up that reached it idle.
	Unsolicited bool
	// Started and Ended bound the turn on the host's clock.
	Started, Ended time.Time
}

type turnState struct {
	promptIDs []string
	// queuedIDs are prompts queued into this turn with StreamingBehavior;
	// omp may fail one after acknowledging it, which fails the turn.
	queuedIDs []string
	// starts counts the agent runs still expected to begin (agent_start);
	// the turn ends at a terminal agent_end once none is outstanding, so a
	// stale agent_end from an aborted run never ends a new turn.
	starts int
	// unacked counts this turn's prompts not yet acknowledged. The agent
	// acknowledges a prompt before it starts the prompt's run, so an
	// agent_end read before the acknowledgement is from earlier work.
	unacked int
	// started: an agent_start arrived for this turn.
	started bool
	// staleEnds counts runs that were open (agent_start seen, no agent_end)
	// when the turn began: their agent_end is not this turn's.
	staleEnds int
	retained  int
	result    Turn
	err       error
	done      chan struct{}
	settled   bool
	waiting   bool
	// probing: a non-terminal or failed agent_end was seen and get_state
	// is being polled to learn whether the agent settled; confirmIdle is
	// how many consecutive idle answers (250 ms apart) settle the turn.
	probing     bool
	confirmIdle int
	// noRun: a get_state poll runs to learn whether an acknowledged
	// prompt started no run (see probeNoRun); aborted: an abort was
	// acknowledged before any run of this turn started. kick wakes the
	// poll early.
	noRun   bool
	aborted bool
	kick    chan struct{}
	// adoptAcked: an adopted turn whose prompt's acknowledgement this
	// client read (see adoptedReply).
	adoptAcked bool
	// runSeen: an agent_start of this turn was read (started may also be
	// assumed, see Adopt.RunOpen).
	runSeen bool
}

// turnTrack is the client's view of the agent's runs, read and written
// under Client.mu by the reader.
type turnTrack struct {
	// runOpen: an agent_start was read and its agent_end not yet.
	runOpen bool
	// queuedInto maps a prompt sent with StreamingBehavior, until its
	// acknowledgement, to the turn it was sent into.
	queuedInto map[string]*turnState
}

// No-run probes (see probeNoRun). After an acknowledgement the agent may
// still be preparing the run (omp acknowledges before its preflight), so
// idleness must hold across noRunIdleAnswers answers spread over about
// 1.5 s; after an acknowledged abort no run is coming, so two suffice.
const (
	noRunDelay        = 500 * time.Millisecond
	noRunEvery        = 500 * time.Millisecond
	noRunIdleAnswers  = 3
	abortedEvery      = 250 * time.Millisecond
	abortedIdleAnswer = 2
)

func newTurn() *turnState {
	t := &turnState{done: make(chan struct{}), kick: make(chan struct{}, 1)}
	t.result.Started = time.Now()
	t.result.AgentInvoked = true
	return t
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
// prompt without StreamingBehavior fails with ErrTurnInProgress; one with
// StreamingBehavior joins the running turn, and with no turn running it
// starts one (the agent runs it as a plain prompt). A run the agent starts
// without a prompt of this client is tracked as a turn too (Turn.Unsolicited)
// and counts as running.
func (c *Client) Prompt(ctx context.Context, message string, opts *PromptOptions) error {
	cmd := PromptCommand{Message: message}
	if opts != nil {
		cmd.Images, cmd.StreamingBehavior = opts.Images, opts.StreamingBehavior
	}
	if cmd.StreamingBehavior != "" {
		if queued, err := c.queuePrompt(ctx, cmd); queued {
			return err
		}
	}
	return c.startTurn(ctx, cmd.CommandType(), cmd, false)
}

// queuePrompt sends a prompt with StreamingBehavior into the running turn;
// queued is false when no turn runs (the caller starts one instead).
func (c *Client) queuePrompt(ctx context.Context, cmd PromptCommand) (queued bool, err error) {
	id := c.newID()
	line, err := encodeCommand(id, cmd.CommandType(), cmd)
	if err != nil {
		return true, err
	}
	c.mu.Lock()
	t := c.turn
	if t == nil || t.settled {
		c.mu.Unlock()
		return false, nil
	}
	if c.track.queuedInto == nil {
		c.track.queuedInto = map[string]*turnState{}
	}
	c.track.queuedInto[id] = t
	t.queuedIDs = append(t.queuedIDs, id)
	c.mu.Unlock()
	_, err = c.roundTrip(ctx, id, cmd.CommandType(), line)
	c.mu.Lock()
	delete(c.track.queuedInto, id)
	c.mu.Unlock()
	return true, err
}

// AbortAndPrompt aborts the running work and prompts at once (omp). The
// running turn, if any, continues as this prompt's turn; without one, a new
// turn starts. If the agent refuses it, the running turn is left as it was.
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
	created := false
	switch {
	case t != nil && !t.settled && !replace:
		c.mu.Unlock()
		return ErrTurnInProgress
	case t != nil && !t.settled && replace:
		t.starts++
		t.unacked++
		t.promptIDs = append(t.promptIDs, id)
	default:
		created = true
		t = newTurn()
		t.promptIDs, t.starts, t.unacked = []string{id}, 1, 1
		if c.track.runOpen {
			// A run the client no longer tracks (its turn was settled
			// early, e.g. by Run's context) still has its end to come.
			t.staleEnds = 1
		}
		c.turn = t
	}
	c.mu.Unlock()

	resp, err := c.roundTrip(ctx, id, typ, line)
	if err != nil {
		if resp != nil {
			err = fmt.Errorf("%w: %w", ErrPromptFailed, err)
		}
		if created {
			c.settleTurn(t, err)
		} else {
			c.mu.Lock()
			c.rollbackPromptLocked(t, id)
			c.mu.Unlock()
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

// rollbackPromptLocked undoes what startTurn set up for a replacing prompt
// the agent refused or never got: the running turn goes on as before, and
// its own agent_end still ends it. It is idempotent.
func (c *Client) rollbackPromptLocked(t *turnState, id string) {
	i := slices.Index(t.promptIDs, id)
	if i < 0 {
		return
	}
	t.promptIDs = slices.Delete(t.promptIDs, i, i+1)
	if t.starts > 0 {
		t.starts--
	}
	if t.unacked > 0 {
		t.unacked--
	}
}

// noteReplyLocked is called by the reader, under c.mu, with the first
// response to request id, before the caller sees it: turn bookkeeping
// happens in stream order, ahead of the events that follow the response.
func (c *Client) noteReplyLocked(id string, r *Response) {
	if qt, ok := c.track.queuedInto[id]; ok {
		delete(c.track.queuedInto, id)
		if r.Success && qt.settled && (c.turn == qt || c.turn == nil) {
			// The turn it was queued into ended before the agent took it:
			// the agent was idle and runs it as a new prompt. Track that
			// run now, so WaitTurn after Prompt waits for it.
			t := newTurn()
			t.promptIDs, t.starts = []string{id}, 1
			c.turn = t
			c.maybeNoRunProbeLocked(t)
		} else if r.Success && c.turn != qt && c.turn != nil && !c.turn.settled {
			// The run already started (an unsolicited turn): it is this
			// prompt's.
			c.turn.queuedIDs = append(c.turn.queuedIDs, id)
		}
		return
	}
	t := c.turn
	if t == nil || t.settled || !slices.Contains(t.promptIDs, id) {
		return
	}
	if !r.Success {
		if len(t.promptIDs) > 1 || t.promptIDs[0] != id {
			// A refused AbortAndPrompt into a running turn: undo it here,
			// in stream order, so the running turn's agent_end that may
			// follow is not taken for a stale one.
			c.rollbackPromptLocked(t, id)
		}
		return
	}
	if t.unacked > 0 {
		t.unacked--
	}
	if !t.started {
		c.maybeNoRunProbeLocked(t)
	}
}

// maybeNoRunProbeLocked starts probeNoRun after a prompt's acknowledgement,
// unless the agent announced itself with ready (omp): omp reports a prompt
// that starts no run with prompt_result, and its get_state says idle while
// it still prepares a prompt (images, slash commands), so polling it could
// end a turn whose run is about to start.
func (c *Client) maybeNoRunProbeLocked(t *turnState) {
	if c.ready == nil && (c.opts.Adopt == nil || !c.opts.Adopt.Ready) {
		c.startNoRunProbeLocked(t)
	}
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
// agent_end (stop reason "aborted"). A turn whose run had not started when
// the agent acknowledged the abort may never start one (omp acknowledges a
// prompt and an abort and runs nothing): it ends once get_state reports the
// agent idle, with stop reason "aborted" and AgentInvoked false.
func (c *Client) Abort(ctx context.Context) error {
	c.mu.Lock()
	t := c.turn
	c.mu.Unlock()
	if err := c.Call(ctx, AbortCommand{}, nil); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t != nil && t == c.turn && !t.settled && !t.started && t.unacked == 0 {
		t.aborted = true
		c.startNoRunProbeLocked(t)
	}
	return nil
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
// then share (an Event cannot be mutated). A frame not yet validated
// (unchecked) is validated before the turn keeps it: checked reports that
// it was, and err that it is invalid (then nothing was recorded).
func (c *Client) trackTurn(typ string, line []byte, ev *Event, unchecked bool) (checked bool, err error) {
	c.mu.Lock()
	defer func() {
		if err != nil {
			c.mu.Unlock()
		}
	}()
	switch typ {
	case EventAgentStart:
		c.track.runOpen = true
		if (c.turn == nil || c.turn.settled) && c.exitErr == nil && !c.closed {
			// A run no prompt of ours is waiting for: a follow-up or steer
			// that reached the agent idle, or omp's own run. Track it as a
			// turn, so it ends like any other and WaitTurn returns it.
			// Not once the transport is retired (Close, a backlog
			// overflow, a broken write): nothing is sure to settle that
			// turn, and a waiter would hang on it.
			t := newTurn()
			t.result.Unsolicited = true
			t.starts = 1
			c.turn = t
		}
	case EventAgentEnd:
		c.track.runOpen = false
	}
	t := c.turn
	if t == nil || t.settled {
		c.mu.Unlock()
		return false, nil
	}
	if t.retained+len(line) <= c.opts.RetainedTurnBytes {
		if unchecked {
			// Only the frequent types the reader does not act on come
			// unchecked: refusing one here changes nothing else.
			if _, err := scanFrame(line); err != nil {
				return false, err
			}
			checked = true
		}
		// A copy: a kept slice of the reader's buffer would pin the whole
		// buffer for as long as the Turn lives.
		ev.raw = bytes.Clone(line)
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
		t.started, t.runSeen = true, true
		t.probing = false
	case EventMessageEnd:
		var m MessageEndEvent
		if json.Unmarshal(line, &m) == nil {
			if t.retained+len(line) <= c.opts.RetainedTurnBytes {
				t.result.Messages = append(t.result.Messages, m.Message)
				t.retained += len(line)
			} else {
				t.result.DroppedMessages++
			}
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
		if !t.started {
			if t.unacked > 0 {
				// Read before the prompt's acknowledgement: earlier work.
				break
			}
			if t.staleEnds > 0 {
				// The end of a run open before this turn began.
				t.staleEnds--
				break
			}
			// A run that ended without announcing its start (a minimal
			// agent that sends no agent_start): this turn's run.
			t.started = true
			if t.starts > 0 {
				t.starts--
			}
		}
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
		if json.Unmarshal(line, &e) == nil && !e.Success {
			// Retrying gave up, or was cancelled ("Retry cancelled", an
			// abort during the delay): the announced run never starts.
			if t.starts > 0 {
				t.starts--
			}
			settle = t.starts == 0 && !c.track.runOpen
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
		// The reader settles it once this frame is queued for the
		// listeners (settlePending), so a Sync after WaitTurn returns
		// only when they have seen the turn's last frame.
		c.settling = t
	}
	return checked, nil
}

// settlePending settles the turn trackTurn found ended, after the reader
// queued the frame that ended it. Reader goroutine only.
func (c *Client) settlePending() {
	if t := c.settling; t != nil {
		c.settling = nil
		c.settleTurn(t, nil)
	}
}

// startNoRunProbeLocked starts (or, after an abort, hurries) probeNoRun
// for t.
func (c *Client) startNoRunProbeLocked(t *turnState) {
	if t.noRun {
		select {
		case t.kick <- struct{}{}:
		default:
		}
		return
	}
	t.noRun = true
	c.wg.Add(1)
	go c.probeNoRun(t)
}

// probeNoRun settles a turn whose prompt was acknowledged but whose run
// never started: pi acknowledges a prompt an extension command consumed
// and sends nothing more; omp acknowledges a prompt and an abort sent right
// after it and runs nothing. No event says so, hence the poll.
//
// The rule: the turn settles (AgentInvoked false) once get_state reports
// the agent idle with nothing queued noRunIdleAnswers times in a row, the
// first asked noRunDelay after the acknowledgement, and no agent_start of
// this turn was read before the last answer. The answers come on the same
// stream as the events, so an agent_start written before an answer is seen
// before it, and pi marks itself streaming before it writes anything after
// the acknowledgement: one idle answer would do for pi; the margin (about
// 1.5 s of idleness) is for agents that acknowledge first and prepare the
// run after. omp is one, so it is polled only after an acknowledged abort
// (see maybeNoRunProbeLocked); then no run is coming, and two answers
// 250 ms apart suffice.
func (c *Client) probeNoRun(t *turnState) {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		t.noRun = false
		c.mu.Unlock()
	}()
	ctx, cancel := c.lifetimeCtx()
	defer cancel()
	pause := func(d time.Duration) bool {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-t.kick:
		case <-t.done:
			return false
		case <-ctx.Done():
			return false
		}
		return true
	}
	params := func() (live bool, every time.Duration, need int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if t.settled || t.started {
			return false, 0, 0
		}
		if t.aborted {
			return true, abortedEvery, abortedIdleAnswer
		}
		return true, noRunEvery, noRunIdleAnswers
	}
	live, _, _ := params()
	if !live {
		return
	}
	c.mu.Lock()
	aborted := t.aborted
	c.mu.Unlock()
	if !aborted && !pause(noRunDelay) {
		return
	}
	idle := 0
	for {
		if live, _, _ := params(); !live {
			return
		}
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := c.GetState(qctx)
		qcancel()
		live, every, need := params()
		if !live {
			return
		}
		if err == nil && !st.IsStreaming && !st.IsCompacting && st.Queued() == 0 {
			idle++
		} else {
			idle = 0
		}
		if idle >= need {
			c.mu.Lock()
			ok := !t.started && !t.settled
			if ok {
				t.result.AgentInvoked = false
				if t.aborted {
					t.result.StopReason = StopReasonAborted
				}
			}
			c.mu.Unlock()
			if ok {
				c.settleTurn(t, nil)
			}
			return
		}
		if !pause(every) {
			return
		}
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
