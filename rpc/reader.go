package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// readLoop is the only reader of the agent's stdout. It never blocks on a
// listener: events go to a bounded queue, responses straight to waiters.
func (c *Client) readLoop() {
	defer close(c.readDone)
	// Stable lines: events keep slices of the read buffers instead of
	// copies (see Event).
	fr := newFramer(c.r, c.opts.MaxLineBytes, true)
	fr.onFlood = c.resizePipe
	first := true
	for {
		line, err := fr.next()
		if err != nil {
			var tl *LineTooLongError
			if errors.As(err, &tl) {
				// The next frame starts past the skipped line.
				c.readEnd = c.opts.Adopt.offset() + fr.offset()
				c.reportError(&ProtocolError{Op: "frame", Err: err})
				if first {
					c.firstOnce.Do(func() { c.firstFrame <- fmt.Errorf("rpc: start: first frame: %w", err) })
					first = false
				}
				continue
			}
			c.endTransport(err)
			return
		}
		if first {
			first = false
			if h, serr := scanFrame(line); serr != nil {
				err := fmt.Errorf("rpc: start: the agent's first frame is not a JSON object (%v): %q", serr, quoteFrame(line))
				c.firstOnce.Do(func() { c.firstFrame <- err })
				c.frameError(h, line, serr)
				c.readEnd = c.opts.Adopt.offset() + fr.offset()
				continue
			}
			c.firstOnce.Do(func() { c.firstFrame <- nil })
		}
		c.lineStart = c.readEnd
		c.readEnd = c.opts.Adopt.offset() + fr.offset()
		c.readStart = c.lineStart
		c.handleLine(line)
		if c.runEnded {
			c.runEnded = false
			fr.settle()
		}
	}
}

// handleLine processes one complete frame. line stays valid after the
// call (the framer is stable), so events may keep it.
func (c *Client) handleLine(line []byte) {
	if typ, ok := fastType(line); ok && !c.reasm.pending() {
		// A frequent event the reader neither acts on nor ends turns by:
		// the dispatcher validates it, on the other core, before any
		// listener sees it, unless the dispatcher is falling behind (the
		// backlog three quarters full); then the reader shares the work.
		// Not sooner: one flood read hands the queue hundreds of frames at
		// once, and a reader validating them would do the work the
		// dispatcher is idle for.
		deferred := c.qlen.Load() < int32(c.opts.Backlog*3/4)
		if !deferred {
			if h, err := scanFrame(line); err != nil {
				c.frameError(h, line, err)
				return
			}
		}
		ev := Event{Type: typ, start: c.readStart, end: c.readEnd}
		// A frame the turn keeps is checked there (an invalid one must not
		// stay in Turn.Events), so the dispatcher need not check it again.
		checked, err := c.trackTurn(typ, line, &ev, deferred)
		if err != nil {
			h, _ := scanFrame(line)
			c.frameError(h, line, err)
			return
		}
		if checked {
			deferred = false
		}
		if ev.raw == nil {
			ev.raw = frameRef(line)
		}
		c.enqueue(dispatchItem{ev: ev, validate: deferred})
		c.settlePending()
		return
	}
	h, err := scanFrame(line)
	if err != nil {
		c.frameError(h, line, err)
		return
	}
	typ := internType(h.typ)
	if h.typEsc {
		typ = headString(h.typ, true)
	}
	if typ == "rpc_chunk" {
		c.handleChunk(line)
		return
	}
	if c.reasm.pending() {
		c.reasm.reset()
		c.reportError(&ProtocolError{Op: "chunk", Err: errors.New("rpc_chunk sequence interrupted by another frame; the chunked frame is lost")})
	}
	c.handleFrame(typ, line)
}

func (c *Client) handleChunk(line []byte) {
	c.mu.Lock()
	v2 := c.v2
	c.mu.Unlock()
	if !v2 {
		// Chunks exist only in protocol v2; reassembling them unasked would
		// let any agent make the client buffer up to the reassembly cap.
		c.reportError(&ProtocolError{Op: "chunk", Err: errors.New("rpc_chunk frame while protocol v2 is not negotiated; dropped")})
		return
	}
	if !c.reasm.pending() {
		c.chunkStart = c.lineStart // a reassembled frame starts at its first chunk
	}
	whole, err := c.reasm.push(line)
	if err != nil {
		c.reportError(&ProtocolError{Op: "chunk", Err: err})
		return
	}
	if whole == nil {
		return
	}
	h, err := scanFrame(whole)
	if err != nil {
		perr := &ProtocolError{Op: "chunk", Err: fmt.Errorf("reassembled frame: %w", err)}
		c.failWaiters(h, perr)
		c.reportError(perr)
		return
	}
	typ := headString(h.typ, h.typEsc)
	if typ == "rpc_chunk" {
		c.reportError(&ProtocolError{Op: "chunk", Err: errors.New("reassembled frame is itself a chunk")})
		return
	}
	c.readStart = c.chunkStart
	c.handleFrame(typ, whole)
}

func (c *Client) handleFrame(typ string, line []byte) {
	if typ == EventAgentEnd {
		c.runEnded = true
	}
	switch typ {
	case "response":
		c.noteNegotiation(line)
		c.handleResponse(line)
		if c.hasListeners() {
			c.enqueue(dispatchItem{ev: Event{Type: typ, raw: frameRef(line), start: c.readStart, end: c.readEnd}})
		}
		c.settlePending() // an adopted turn this answer decided
		return
	case "ready":
		c.handleReady(line)
	case "host_tool_call":
		c.handleHostToolCall(line)
	case "host_tool_cancel":
		c.handleCancel(line, c.toolCancel)
	case "extension_ui_request":
		c.handleUIRequest(line)
	}
	ev := Event{Type: typ, start: c.readStart, end: c.readEnd}
	_, _ = c.trackTurn(typ, line, &ev, false)
	if c.hasListeners() {
		if ev.raw == nil {
			ev.raw = frameRef(line)
		}
		c.enqueue(dispatchItem{ev: ev})
	}
	c.settlePending()
}

// enqueue hands an item to the dispatcher. When the backlog is full (in
// events or bytes) the reader waits for room, but at most
// Options.StallTimeout without progress: listeners that make no progress
// for that long are an overflow, which fails the turn and retires the
// transport. With Options.Backpressure it waits without that limit while
// the client runs. The reader never waits unbounded.
func (c *Client) enqueue(it dispatchItem) {
	if c.queueOrHold(it) {
		return
	}
	// Held (see Client.holding) until queued or dropped: a Sync meanwhile
	// waits behind it.
	defer c.release()
	// Set before the next try: the dispatcher reads it after freeing bytes,
	// so either the try sees the room or the dispatcher sends space.
	c.roomWait.Add(1)
	defer c.roomWait.Add(-1)
	t := time.NewTimer(c.opts.StallTimeout)
	defer t.Stop()
	var stall <-chan time.Time
	if !c.opts.Backpressure {
		stall = t.C
	}
	done := c.done
	closing := false
	for {
		if c.tryQueue(it) {
			return
		}
		select {
		case <-c.space:
			// Progress: the stall clock starts again.
			t.Reset(c.opts.StallTimeout)
		case <-c.quit:
			return
		case <-done:
			if !c.opts.Backpressure {
				// Closed or retired while the backlog is full: Close must
				// not wait on listeners that do not keep up. What is queued
				// is still delivered; this event is counted as dropped.
				c.keepError(fmt.Errorf("%w: a %s event arrived during Close with the backlog full and was dropped", ErrBacklogOverflow, it.ev.Type))
				return
			}
			// Backpressure: keep delivering while listeners progress.
			// Close does not wait for that (listeners are user code):
			// Wait does.
			done, closing, stall = nil, true, t.C
			t.Reset(c.opts.StallTimeout)
			c.parkOnce.Do(func() { close(c.readerParked) })
		case <-stall:
			if closing {
				c.keepError(fmt.Errorf("%w: a %s event arrived during Close and listeners made no progress for %v; dropped", ErrBacklogOverflow, it.ev.Type, c.opts.StallTimeout))
				return
			}
			err := fmt.Errorf("%w: %d events (%d bytes) queued and listeners made no progress for %v", ErrBacklogOverflow, c.qlen.Load(), c.qbytes.Load(), c.opts.StallTimeout)
			c.keepError(err)
			c.log.Error("rpc: event backlog overflow; retiring the transport", "backlog", c.opts.Backlog, "backlogBytes", c.opts.BacklogBytes, "stall", c.opts.StallTimeout)
			c.failTurn(err)
			c.retire(err)
			// Retire the agent too: with stdin closed it exits, and reading ends.
			_ = c.w.Close()
			return
		}
	}
}

// queueOrHold queues it, or, when the backlog is full, counts it as held
// (in the same critical section, so no Sync barrier can slip in between)
// and returns false; the caller then retries with tryQueue and ends with
// release.
func (c *Client) queueOrHold(it dispatchItem) bool {
	c.qmu.Lock()
	ok := c.appendLocked(it)
	if !ok {
		c.holding++
	}
	c.qmu.Unlock()
	if ok {
		c.wakeDispatcher()
	}
	return ok
}

// release ends a hold (queueOrHold): once no item is held, the Sync
// barriers parked behind the held items are queued.
func (c *Client) release() {
	c.qmu.Lock()
	c.holding--
	var flushed bool
	if c.holding == 0 && len(c.parked) > 0 {
		// Barriers carry no bytes and are bounded by the Sync calls
		// waiting: queued past Backlog if need be.
		c.queue = append(c.queue, c.parked...)
		c.qlen.Store(int32(len(c.queue)))
		clear(c.parked)
		c.parked = c.parked[:0]
		flushed = true
	}
	c.qmu.Unlock()
	if flushed {
		c.wakeDispatcher()
	}
}

// tryQueue appends it unless the backlog is full (Backlog events, or
// BacklogBytes with something already queued), and wakes the dispatcher.
func (c *Client) tryQueue(it dispatchItem) bool {
	c.qmu.Lock()
	ok := c.appendLocked(it)
	c.qmu.Unlock()
	if ok {
		c.wakeDispatcher()
	}
	return ok
}

// appendLocked appends it unless the backlog is full; qmu held.
func (c *Client) appendLocked(it dispatchItem) bool {
	n := int64(len(it.ev.raw))
	if len(c.queue) >= c.opts.Backlog {
		return false
	}
	// qbytes grows only under qmu; the dispatcher only lowers it, so the
	// room seen here cannot shrink before the add.
	if b := c.qbytes.Load(); b > 0 && b+n > int64(c.opts.BacklogBytes) {
		return false
	}
	c.queue = append(c.queue, it)
	c.qlen.Store(int32(len(c.queue)))
	c.qbytes.Add(n)
	return true
}

func (c *Client) wakeDispatcher() {
	select {
	case c.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// queueBarrier queues a Sync barrier: behind every item an enqueue holds
// (parked until they are queued), else at the backlog's end. False when
// the backlog is full and nothing is held (the caller retries).
func (c *Client) queueBarrier(it dispatchItem) bool {
	c.qmu.Lock()
	if c.holding > 0 {
		c.parked = append(c.parked, it)
		c.qmu.Unlock()
		return true
	}
	ok := c.appendLocked(it)
	c.qmu.Unlock()
	if ok {
		c.wakeDispatcher()
	}
	return ok
}

// dispatchLoop runs listeners, one item at a time in arrival order, taking
// the whole backlog per wake-up. When the client closes (the reader has
// stopped by then) it delivers what is still queued, then returns: events
// that arrived are never dropped silently.
func (c *Client) dispatchLoop() {
	defer c.wg.Done()
	for {
		quit := false
		select {
		case <-c.wake:
		case <-c.quit:
			quit = true
		}
		for {
			c.qmu.Lock()
			if len(c.queue) == 0 {
				c.qmu.Unlock()
				break
			}
			// Swap buffers: queue and spare never share an array.
			batch := c.queue
			c.queue = c.spare[:0]
			c.qlen.Store(0)
			c.qmu.Unlock()
			select {
			case c.space <- struct{}{}:
			default:
			}
			for _, it := range batch {
				c.dispatch(it)
				if n := len(it.ev.raw); n > 0 {
					c.qbytes.Add(-int64(n))
					if c.roomWait.Load() > 0 {
						select {
						case c.space <- struct{}{}:
						default:
						}
					}
				}
			}
			clear(batch) // drop the frames for the collector
			c.spare = batch
		}
		if quit {
			return
		}
	}
}

func (c *Client) dispatch(it dispatchItem) {
	if it.barrier != nil {
		close(it.barrier)
		return
	}
	// The slices are copy-on-write (On and unsubscribe replace them), so
	// these snapshots can be used after the lock without copying.
	c.lmu.RLock()
	typed, all, els := c.listeners[it.ev.Type], c.all, c.errLs
	c.lmu.RUnlock()
	if it.validate {
		if h, err := scanFrame(it.ev.raw); err != nil {
			// Reported here, not through reportError: the dispatcher must
			// never wait on its own queue.
			perr := &ProtocolError{Op: "frame", Frame: quoteFrame(it.ev.raw), Err: err}
			c.failWaiters(h, perr)
			c.keepError(perr)
			c.log.Warn("rpc: protocol error", "op", perr.Op, "err", err)
			for _, el := range els {
				c.safeCallErr(el.fn, perr)
			}
			return
		}
	}
	if it.err != nil {
		for _, l := range els {
			c.safeCallErr(l.fn, it.err)
		}
		return
	}
	for _, group := range [2][]*listener{typed, all} {
		for _, l := range group {
			if perr := c.safeCall(l.fn, it.ev); perr != nil {
				c.keepError(perr)
				c.log.Error("rpc: event listener panicked", "type", it.ev.Type)
				for _, el := range els {
					c.safeCallErr(el.fn, perr)
				}
			}
		}
	}
}

// ListenerPanicError reports a listener that panicked; the client recovered.
type ListenerPanicError struct {
	EventType string
	Value     any
}

func (e *ListenerPanicError) Error() string {
	return fmt.Sprintf("rpc: listener for %q panicked: %v", e.EventType, e.Value)
}

func (c *Client) safeCall(fn func(Event), ev Event) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &ListenerPanicError{EventType: ev.Type, Value: v}
		}
	}()
	fn(ev)
	return nil
}

func (c *Client) safeCallErr(fn func(error), e error) {
	defer func() {
		if v := recover(); v != nil {
			c.log.Error("rpc: error listener panicked")
		}
	}()
	fn(e)
}

func (c *Client) handleResponse(line []byte) {
	var r Response
	// The id is decoded apart: a number (from a hand-written RequestLine)
	// is matched by its literal text, as RequestLine keys it.
	var wire struct {
		*Response
		ID json.RawMessage `json:"id"`
	}
	wire.Response = &r
	if err := json.Unmarshal(line, &wire); err != nil {
		c.reportError(&ProtocolError{Op: "response", Frame: quoteFrame(line), Err: err})
		return
	}
	if id := bytes.TrimSpace(wire.ID); len(id) > 0 && !bytes.Equal(id, []byte("null")) {
		if id[0] == '"' {
			if err := json.Unmarshal(id, &r.ID); err != nil {
				c.reportError(&ProtocolError{Op: "response", Frame: quoteFrame(line), Err: err})
				return
			}
		} else {
			r.ID = string(id)
		}
	}
	c.mu.Lock()
	if r.ID != "" {
		if p, ok := c.pending[r.ID]; ok {
			delete(c.pending, r.ID)
			c.removeFromCommandLocked(p)
			c.noteReplyLocked(r.ID, &r)
			c.decideAdoptedLocked(p.command, &r)
			c.mu.Unlock()
			p.ch <- &r
			return
		}
		if _, ok := c.abandoned[r.ID]; ok {
			c.dropTombstoneLocked(r.ID)
			c.mu.Unlock()
			c.log.Debug("rpc: dropped a reply to an abandoned request", "command", r.Command)
			return
		}
		t := c.turn
		if t != nil && (slices.Contains(t.promptIDs, r.ID) || slices.Contains(t.queuedIDs, r.ID)) {
			// omp's second response to a prompt it acknowledged: a late
			// failure ends the turn the prompt started or was queued into.
			c.mu.Unlock()
			if !r.Success {
				c.settleTurn(t, fmt.Errorf("%w: %w", ErrPromptFailed, r.err(true)))
			}
			return
		}
		c.mu.Unlock()
		if c.opts.Adopt != nil && !strings.HasPrefix(r.ID, c.idPrefix) {
			// Read again from the agent's output: the answer to a
			// request of the client before.
			c.adoptedReply(r)
			return
		}
		c.reportError(&ProtocolError{Op: "response", Err: fmt.Errorf("response to unknown request (command %q)", r.Command)})
		return
	}
	// No id: the agent could not read the id (unknown command, parse
	// error). Match the oldest pending request of that command.
	key := r.Command
	q := c.byCommand[key]
	if len(q) == 0 && (key == "parse" || key == "") {
		key = rawCommandKey
		q = c.byCommand[key]
	}
	if len(q) == 0 {
		c.mu.Unlock()
		c.reportError(&ProtocolError{Op: "response", Err: fmt.Errorf("id-less response matches no pending request (command %q): %s", r.Command, r.Error)})
		return
	}
	p := q[0]
	c.removeFromCommandLocked(p)
	if p.dead {
		c.mu.Unlock()
		return // the late answer to a timed-out request: dropped
	}
	delete(c.pending, p.id)
	c.noteReplyLocked(p.id, &r)
	c.decideAdoptedLocked(p.command, &r)
	c.mu.Unlock()
	p.ch <- &r
}

// decideAdoptedLocked decides the run an adopted client assumed open
// (Adopt.RunOpen) at the first get_state answer it reads, on the reader,
// before the frame after it: the answer comes on the same stream as the
// events, so whatever the agent wrote before it has been read, and what
// it writes after (a run it starts at once) has not. Not streaming, and
// no acknowledged prompt waiting for its run: the assumed run ended
// before the offset, and the turn ends here with AgentInvoked false (the
// reader settles it once this answer is queued). Under c.mu, reader only.
func (c *Client) decideAdoptedLocked(command string, r *Response) {
	if !c.adoptDecide || command != "get_state" || !r.Success {
		return // a failed answer decides nothing: the next one will
	}
	c.adoptDecide = false
	t := c.adopted
	if t == nil || t.settled || c.turn != t {
		return
	}
	var st struct {
		IsStreaming bool `json:"isStreaming"`
	}
	if json.Unmarshal(r.Data, &st) != nil || st.IsStreaming {
		return // a run is in progress: its agent_end ends the turn
	}
	switch {
	case t.adoptAcked && !t.started:
		// The previous client's prompt was acknowledged after the offset:
		// omp says idle while it prepares the run, which may still come.
		// The turn ends as any acknowledged prompt's does.
		c.maybeNoRunProbeLocked(t)
	case t.runSeen:
		// The run's agent_start was read after the offset: it is this
		// turn's, and its agent_end ends it.
	default:
		t.result.AgentInvoked = false
		c.track.runOpen = false
		c.settling = t
	}
}

// frameError reports a frame that is not valid JSON or has a duplicated
// "type" or "id" key, and fails the requests it names.
func (c *Client) frameError(h frameHead, line []byte, err error) {
	perr := &ProtocolError{Op: "frame", Frame: quoteFrame(line), Err: err}
	c.failWaiters(h, perr)
	c.reportError(perr)
}

// failWaiters fails each pending request a refused frame names by id (a
// frame with a duplicated key, which may have been meant as its response),
// so no caller waits for a response that was read and refused. Syntax
// errors name no id reliably and fail nobody.
func (c *Client) failWaiters(h frameHead, perr error) {
	var dk *DuplicateKeyError
	if !errors.As(perr, &dk) {
		return
	}
	for _, id := range h.idStrings() {
		c.mu.Lock()
		p, ok := c.pending[id]
		if ok {
			delete(c.pending, id)
			c.removeFromCommandLocked(p)
		}
		c.mu.Unlock()
		if ok {
			p.ch <- &Response{ID: id, perr: perr}
		}
	}
}

// dropTombstoneLocked removes the placeholder of a timed-out request that
// was answered by id after all.
func (c *Client) dropTombstoneLocked(id string) {
	for _, q := range c.byCommand {
		for _, p := range q {
			if p.id == id {
				c.removeFromCommandLocked(p)
				return
			}
		}
	}
}

// adoptedReply takes a reply to the adopted agent's previous client, read
// again: dropped, except the acknowledgement of the adopted turn's prompt.
// The offset was recorded between the prompt and its acknowledgement, so
// the turn's run has not started yet: the turn now waits for it as for a
// prompt of its own (a restart there used to end the turn on get_state's
// idle answer, and the run came as another turn). A prompt is taken
// before any frame of the turn; an abort_and_prompt also after frames of
// the run it aborts, whose agent_end is then not the turn's end.
func (c *Client) adoptedReply(r Response) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.turn
	adoptable := r.Success && t != nil && t == c.adopted && !t.settled && !t.adoptAcked
	switch {
	case adoptable && r.Command == "prompt" && len(t.result.Events)+t.result.DroppedEvents == 0:
		t.adoptAcked = true
		t.started = false
		t.promptIDs = append(t.promptIDs, r.ID)
		c.track.runOpen = false
		return
	case adoptable && r.Command == "abort_and_prompt":
		t.adoptAcked = true
		t.started = false
		t.promptIDs = append(t.promptIDs, r.ID)
		if c.track.runOpen {
			// The aborted run's agent_end is still to come.
			t.staleEnds = 1
		}
		return
	}
	c.log.Debug("rpc: dropped a reply to the adopted agent's previous client", "command", r.Command)
}

func (c *Client) handleReady(line []byte) {
	var r ReadyEvent
	if err := json.Unmarshal(line, &r); err != nil {
		c.reportError(&ProtocolError{Op: "ready", Err: err})
		return
	}
	c.mu.Lock()
	c.ready = &r
	if r.MaxFrameBytes > 0 {
		c.reasm.frameMax = r.MaxFrameBytes
	}
	if r.MaxReassembledFrameBytes > 0 {
		c.reasm.reassembledMax = min(r.MaxReassembledFrameBytes, int64(c.opts.MaxLineBytes))
	}
	// An adopted client reading the agent's ready frame again keeps the
	// protocol its predecessor negotiated (Adopt.V2).
	wantV2 := !c.opts.DisableV2 && slices.Contains(r.SupportedProtocolVersions, 2) && !c.negotiate && c.opts.Adopt == nil
	id := ""
	if wantV2 {
		c.negotiate = true
		id = c.newID()
		c.negotiateID = id
	}
	c.mu.Unlock()
	if !wantV2 {
		return
	}
	// Never write from the reader: the agent may be blocked writing to us.
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(c.negotiated)
		defer func() {
			c.mu.Lock()
			c.negotiateID = ""
			c.mu.Unlock()
		}()
		ctx, cancel := c.lifetimeCtx()
		defer cancel()
		line, _ := encodeCommand(id, "negotiate_protocol", map[string]int{"protocolVersion": 2})
		if _, err := c.roundTrip(ctx, id, "negotiate_protocol", line); err != nil {
			c.log.Warn("rpc: protocol v2 negotiation failed; staying on v1", "err", err)
		}
	}()
}

// noteNegotiation switches to protocol v2 when line is the agent's
// acceptance of negotiate_protocol. It runs on the reader, before the next
// frame: omp may chunk the very next one.
func (c *Client) noteNegotiation(line []byte) {
	c.mu.Lock()
	id := c.negotiateID
	c.mu.Unlock()
	if id == "" {
		return
	}
	h, err := scanFrame(line)
	if err != nil || !h.hasID || headString(h.id, h.idEsc) != id {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.negotiateID = ""
	var r Response
	if json.Unmarshal(line, &r) != nil || !r.Success {
		return
	}
	var d struct {
		ProtocolVersion int `json:"protocolVersion"`
	}
	_ = json.Unmarshal(r.Data, &d)
	c.v2 = d.ProtocolVersion == 2 || len(r.Data) == 0
}

// endTransport records why reading ended and fails everything waiting.
func (c *Client) endTransport(readErr error) {
	var cause error
	if c.owned != nil {
		cause = waitExit(c.owned, exitStatusWait)
		// The stderr drain ends at the pipe's EOF, just after the exit:
		// its tail says why (bounded: a descendant may hold the pipe).
		waitGroupTimeout(&c.stderrWG, 200*time.Millisecond)
	}
	if cause == nil && readErr != nil && !errors.Is(readErr, io.EOF) && !errors.Is(readErr, os.ErrClosed) {
		cause = readErr
	}
	c.retire(&ExitError{Status: cause, Stderr: c.Stderr()})
}

// retire ends the transport once: every waiter gets err at once.
func (c *Client) retire(err error) {
	c.mu.Lock()
	if c.exitErr != nil {
		c.mu.Unlock()
		return
	}
	c.exitErr = err
	// Waiters watch done and return transportErr; forget them here.
	c.pending = map[string]*pendingCall{}
	c.byCommand = map[string][]*pendingCall{}
	for _, cancel := range c.toolCancel {
		cancel()
	}
	for _, cancel := range c.uiCancel {
		cancel()
	}
	c.mu.Unlock()
	// Before done closes: Start, woken by done, then finds the transport's
	// verdict on the first frame instead of wrapping a bare call failure.
	c.firstOnce.Do(func() { c.firstFrame <- err })
	close(c.done)
	// After: a caller whose turn fails with the agent's exit finds Done
	// closed.
	c.failTurn(err)
}

// Sync returns once every event the client had read when Sync was called
// has been delivered to the listeners, those waiting for room in a full
// backlog included: after WaitTurn, a listener has then seen all of the
// turn's events (the dispatcher runs behind the reader).
// It returns early with ctx's error, or the transport's once the client
// closed and its goroutines ended without delivering them. Do not call it
// from a listener: it would wait for itself.
func (c *Client) Sync(ctx context.Context) error {
	barrier := make(chan struct{})
	it := dispatchItem{barrier: barrier}
	// A full backlog is retried on a timer, not on the space signal, which
	// belongs to the reader.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !c.queueBarrier(it) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("rpc: sync: %w", ctx.Err())
		case <-c.joined:
			return c.transportErr()
		}
	}
	select {
	case <-barrier:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rpc: sync: %w", ctx.Err())
	case <-c.joined:
		// The dispatcher delivers what was queued before it ends.
		select {
		case <-barrier:
			return nil
		default:
			return c.transportErr()
		}
	}
}
