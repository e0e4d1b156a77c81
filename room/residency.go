package room

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agenthost/agenthost/event"
)

// ensureAgent returns the room's resident agent, starting it through the
// resume ladder: resume the recorded session and verify it; if it cannot
// be resumed, start fresh, say so (context.lost), and owe the agent the
// room's transcript.
func (m *Manager) ensureAgent(ctx context.Context, r *roomState, cfg Config) (Agent, error) {
	r.mu.Lock()
	a := r.agent
	r.mu.Unlock()
	if a != nil {
		select {
		case <-a.Done():
			m.release(r, "agent exited")
		default:
			return a, nil
		}
	}
	// A host that stops starts no agent: the turn is queued again for
	// the next host (Detach) or cancelled (Close).
	if m.stopping.Load() {
		return nil, errShutdown
	}
	if err := m.acquireSlot(ctx, r); err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			m.freeSlot()
		}
	}()
	if m.stopping.Load() {
		return nil, errShutdown
	}
	sess := r.sessionID(ctx, m.st)
	for _, d := range []string{r.workspace, filepath.Join(r.dir, "home")} {
		if err := mkdirNoLink(d); err != nil {
			return nil, err
		}
	}
	r.mu.Lock()
	shared := r.wsShared
	r.mu.Unlock()
	spec := AgentSpec{Room: r.id, Workspace: r.workspace, Home: filepath.Join(r.dir, "home"), ReadOnly: shared,
		SessionID: sess, Config: cfg, Tools: m.roomTools(r), MCP: cfg.MCP, Handler: &handler{m: m, r: r}}
	if m.opts.MCP != nil {
		servers, err := m.opts.MCP(ctx, r.id, spec.Workspace)
		if err == nil {
			err = validateMCP(servers)
		}
		if err != nil {
			return nil, fmt.Errorf("resolving the room's MCP servers: %w", err)
		}
		spec.MCP = servers
	}
	startedAt := time.Now()
	a, err := m.opts.Transport.Start(ctx, spec)
	lost := ""
	switch {
	case sess == "":
	case errors.Is(err, ErrSessionNotFound):
		lost = "the agent could not resume session " + sess
		spec.SessionID = ""
		a, err = m.opts.Transport.Start(ctx, spec)
	case err == nil && a.SessionID() != sess:
		lost = "the agent started session " + a.SessionID() + " instead of resuming " + sess
	}
	m.phase(r.id, "", PhaseAgentStart, startedAt, errText(err))
	if err != nil {
		return nil, fmt.Errorf("starting the agent: %w", err)
	}
	started = true
	r.mu.Lock()
	r.agent, r.session = a, a.SessionID()
	r.startedCfg = &cfg
	if lost != "" {
		r.lost = true
	}
	hold := r.holdUntil
	r.mu.Unlock()
	m.holdAgent(r, a, hold)
	handle := ""
	if d, ok := a.(Detachable); ok {
		handle = d.Handle()
	}
	err = m.write(func(tx Tx) error {
		if err := tx.SetSession(r.id, cfg.Agent, a.SessionID()); err != nil {
			return err
		}
		if handle != "" {
			// With agent.started: a host that restarts finds it.
			if err := tx.SetAgentProc(r.id, handle); err != nil {
				return err
			}
		}
		started := event.AgentStarted{SessionID: a.SessionID(), Resumed: sess != "" && lost == ""}
		started.Confinement = confinement(a)
		if started.Confinement == nil {
			started.Confinement = confinement(m.opts.Transport)
		}
		started.Resources = resources(a)
		if p, ok := a.(Pooled); ok {
			if pooled, bind := p.Pooled(); pooled {
				started.Pooled, started.BindMS = true, max(bind.Milliseconds(), 1)
			}
		}
		if _, err := appendEvent(tx, r.id, started); err != nil {
			return err
		}
		if lost != "" {
			_, err := appendEvent(tx, r.id, event.ContextLost{PreviousSessionID: sess, Reason: lost})
			return err
		}
		return nil
	})
	return a, err
}

// sessionID is the room's recorded session.
func (r *roomState) sessionID(ctx context.Context, st Store) string {
	r.mu.Lock()
	s := r.session
	r.mu.Unlock()
	if s != "" {
		return s
	}
	if rec, err := st.Room(ctx, r.id); err == nil {
		return rec.SessionID
	}
	return ""
}

// mkdirNoLink creates dir; an existing symlink there is refused, so a
// workspace cannot be pointed outside the root.
func mkdirNoLink(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("room: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return fmt.Errorf("room: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("room: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("room: %s is not a plain directory", filepath.Base(dir))
	}
	if fi.Mode().Perm() != 0o700 {
		// Back to the room's own: an agent of another room sharing the
		// server's uid may have chmodded it (000 locks the room out).
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("room: %w", err)
		}
	}
	return nil
}

// transcript is the room's own record of the conversation before the
// message accepted at seq upTo, bounded by TranscriptBytes (the newest
// part kept).
func (m *Manager) transcript(room string, upTo int64) string {
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	// Each exchange costs at least a few bytes: this many cover the budget.
	xs, err := m.st.Exchanges(ctx, room, upTo, m.opts.TranscriptBytes/16+1)
	if err != nil || len(xs) == 0 {
		return ""
	}
	var lines []string // newest first
	n := 0
	for _, x := range xs {
		entry := "user"
		if x.Sender != "" {
			entry += " (" + x.Sender + ")"
		}
		entry += ": " + x.Text + "\n"
		if x.Answer != "" {
			entry += "assistant: " + x.Answer + "\n"
		}
		if n+len(entry) > m.opts.TranscriptBytes {
			break
		}
		lines = append(lines, entry)
		n += len(entry)
	}
	if len(lines) == 0 {
		return ""
	}
	slices.Reverse(lines)
	return "[The previous agent session of this conversation was lost. The conversation so far, from the room's own record:]\n" +
		strings.Join(lines, "") + "[End of the earlier conversation. The new message follows.]\n\n"
}

// releaseIfIdle releases the room's agent unless a turn runs or its end
// is being recorded (checked as the agent is taken, so a turn starting
// meanwhile keeps it).
func (m *Manager) releaseIfIdle(r *roomState, reason string, by *event.TokenRef) {
	if a := r.takeAgent(func(r *roomState) bool { return r.turn == nil && !r.ending }); a != nil {
		m.closeAgentBy(r, a, reason, true, by)
	}
}

// release closes the room's agent, if resident, and records its receipt.
func (m *Manager) release(r *roomState, reason string) {
	if a := r.takeAgent(nil); a != nil {
		m.closeAgent(r, a, reason, true)
	}
}

// closeAgent closes a, taken from the room, and records its receipt; free
// gives its slot back (an eviction passes it on instead).
func (m *Manager) closeAgent(r *roomState, a Agent, reason string, free bool) {
	m.closeAgentBy(r, a, reason, free, nil)
}

// closeAgentBy is closeAgent for a release a room token asked for (by).
func (m *Manager) closeAgentBy(r *roomState, a Agent, reason string, free bool, by *event.TokenRef) {
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.ShutdownBudget)
	receipt, err := a.Close(ctx)
	cancel()
	if free {
		m.freeSlot()
	}
	data := event.AgentReleased{Reason: reason, Receipt: receipt, Token: by}
	if err != nil {
		data.Error = err.Error()
		m.log.Error("room: releasing the agent", "room", r.id, "err", err)
	}
	werr := m.write(func(tx Tx) error {
		if d, ok := a.(Detachable); ok && d.Handle() != "" {
			if err := tx.SetAgentProc(r.id, ""); err != nil {
				return err
			}
		}
		if len(receipt) > 0 {
			if _, err := tx.PutReceipt(r.id, receipt); err != nil {
				return err
			}
		}
		_, err := appendEvent(tx, r.id, data)
		return err
	})
	if werr != nil {
		m.log.Error("room: recording a release failed", "room", r.id, "err", werr)
	}
}

// janitor releases rooms idle for IdleAfter.
func (m *Manager) janitor() {
	defer m.wg.Done()
	// A room's own idle_after may be as short as 1 s.
	tick := time.NewTicker(min(m.opts.IdleAfter/4, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
		}
		var idle []*roomState
		m.mu.Lock()
		for _, r := range m.rooms {
			r.mu.Lock()
			after := m.opts.IdleAfter
			if c, err := m.configLocked(r); err == nil {
				after = m.idleAfter(c)
			}
			if r.idleLocked() && time.Since(r.lastUsed) >= after {
				idle = append(idle, r)
			}
			r.mu.Unlock()
		}
		m.mu.Unlock()
		for _, r := range idle {
			// Through the door, passed by if busy (a purge releases the
			// agent itself): the release's agent.released is never
			// written after a purge deleted the room.
			if !r.door.tryEnter() {
				continue
			}
			if a := r.takeAgent((*roomState).idleLocked); a != nil {
				m.closeAgent(r, a, "idle", true)
			}
			r.door.leave(false)
		}
	}
}
