package room

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agenthost/agenthost/record"
)

// State is a room's state: resident or not, its session, the running
// turn, the queue, and what waits on people.
type State struct {
	ID string `json:"id"`
	// Incarnation names this life of the room (see Manager.Incarnation).
	Incarnation string            `json:"incarnation"`
	Resident    bool              `json:"resident"`
	SessionID   string            `json:"session_id"`
	Turn        *TurnRef          `json:"turn,omitempty"`
	Queued      int               `json:"queued"`
	LastSeq     int64             `json:"last_seq"`
	Approvals   []record.Approval `json:"approvals"`
	Questions   []record.Question `json:"questions"`
	// Node is the host that holds the room's lease, with a Cluster ("":
	// none, or one machine).
	Node string `json:"node"`
	// Confinement is what confines the room's agent: the resident one's,
	// else the transport's (nil when the transport does not say).
	Confinement *Confinement `json:"confinement,omitempty"`
	// Resources are the limits of the room's processes and how they
	// hold: the resident agent's, else the room's settings' as the
	// transport would hold them (nil when the transport does not say).
	Resources *Resources `json:"resources,omitempty"`
	// Compute is what the room's turns used together (record.Room's).
	Compute record.Compute `json:"compute"`
	// Turns, Usage and UsageBySender are the room's ended turns and what
	// they cost (record.Room's).
	Turns         int64                         `json:"turns"`
	Usage         record.Usage                  `json:"usage"`
	UsageBySender map[string]record.SenderUsage `json:"usage_by_sender"`
}

// confinement is what x (an Agent or a Transport) reports, or nil.
func confinement(x any) *Confinement {
	if c, ok := x.(Confined); ok {
		cf := c.Confinement()
		return &cf
	}
	return nil
}

// TurnRef names a running turn.
type TurnRef struct {
	ID        string `json:"id"`
	MessageID string `json:"message_id"`
}

// State returns the room's state; ErrNotFound for a room never used.
func (m *Manager) State(ctx context.Context, room string) (State, error) {
	if err := ValidateID(room); err != nil {
		return State{}, err
	}
	rec, err := m.st.Room(ctx, room)
	if err != nil {
		return State{}, err
	}
	st := m.liveState(ctx, rec)
	if st.Approvals, err = m.st.Approvals(ctx, room, true); err != nil {
		return State{}, err
	}
	if st.Questions, err = m.st.Questions(ctx, room, true); err != nil {
		return State{}, err
	}
	return st, nil
}

// liveState is a room's State from its stored record and what the
// Manager holds in memory, without what waits on people.
func (m *Manager) liveState(ctx context.Context, rec record.Room) State {
	room := rec.ID
	st := State{ID: room, Incarnation: incarnation(rec.Created), SessionID: rec.SessionID, LastSeq: rec.LastSeq,
		Turns: rec.Turns, Usage: rec.Usage, UsageBySender: rec.UsageBySender, Compute: rec.Compute}
	m.mu.Lock()
	r := m.rooms[room]
	m.mu.Unlock()
	if r != nil {
		r.mu.Lock()
		st.Resident = r.agent != nil
		if r.session != "" {
			st.SessionID = r.session
		}
		if r.turn != nil {
			st.Turn = &TurnRef{ID: r.turn.id, MessageID: r.turn.messageID}
		}
		st.Queued = r.queuedLocked()
		st.Confinement = confinement(r.agent)
		r.mu.Unlock()
	}
	if st.Confinement == nil {
		st.Confinement = confinement(m.opts.Transport)
	}
	st.Resources = m.limitsState(ctx, room, r)
	m.clusterState(ctx, room, &st)
	return st
}

// incarnation is the name of a room's incarnation created at t (""
// for a store that keeps no creation time).
func incarnation(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixNano(), 36)
}

// Incarnation names the room's present incarnation: a room deleted
// (Purge) and created again under its id is another incarnation, whose
// event log starts at 1 again, so a client that knows the incarnation an
// event's sequence number belongs to can tell a stale position from a
// new one. It is derived from the room's creation time as the store keeps
// it ("" for a store that keeps none; a room on a cluster is created once
// and keeps it); ErrNotFound for a room the store does not know. Read
// from the store once per room's life in memory, then from memory.
func (m *Manager) Incarnation(ctx context.Context, room string) (string, error) {
	if err := ValidateID(room); err != nil {
		return "", err
	}
	m.mu.Lock()
	r := m.rooms[room]
	m.mu.Unlock()
	return m.incarnationOf(ctx, room, r)
}

// incarnationOf is Incarnation with the room's state in memory (r, nil
// when there is none).
func (m *Manager) incarnationOf(ctx context.Context, room string, r *roomState) (string, error) {
	if r != nil {
		r.mu.Lock()
		inc := r.incarnation
		r.mu.Unlock()
		if inc != "" {
			return inc, nil
		}
	}
	rec, err := m.st.Room(ctx, room)
	if err != nil {
		return "", err
	}
	inc := incarnation(rec.Created)
	if r != nil {
		// Not into a retired state: the record may be its successor's.
		r.mu.Lock()
		if !r.retired && r.incarnation == "" {
			r.incarnation = inc
		}
		r.mu.Unlock()
	}
	return inc, nil
}

// withIncarnation fills acc's Incarnation (left "" when the store cannot
// say now: the message is accepted all the same); r is the room's state
// (nil: looked up).
func (m *Manager) withIncarnation(ctx context.Context, room string, r *roomState, acc Accepted) Accepted {
	if acc.ID == "" {
		return acc
	}
	if r == nil {
		m.mu.Lock()
		r = m.rooms[room]
		m.mu.Unlock()
	}
	if inc, err := m.incarnationOf(ctx, room, r); err == nil {
		acc.Incarnation = inc
	}
	return acc
}

// RoomPager is a Store that reads a page of rooms, with their last
// sequence numbers, and the room count in one query each (the SQLite
// store). Rooms of another Store are paged from RoomIDs.
type RoomPager interface {
	RoomPage(ctx context.Context, after string, limit int) ([]record.Room, error)
	RoomCount(ctx context.Context) (int, error)
}

// RoomsPage is one page of RoomPage.
type RoomsPage struct {
	Rooms []State
	// Total is the number of rooms the store knows; More says rooms
	// follow the page's last.
	Total int
	More  bool
}

// RoomPage returns the states of up to limit rooms whose ids sort after
// after, in order of id. Its cost depends on limit, not on the number of
// rooms, when the Store is a RoomPager.
func (m *Manager) RoomPage(ctx context.Context, after string, limit int) (RoomsPage, error) {
	var page RoomsPage
	var recs []record.Room
	if p, ok := m.st.(RoomPager); ok {
		var err error
		if recs, err = p.RoomPage(ctx, after, limit+1); err != nil {
			return RoomsPage{}, err
		}
		if page.Total, err = p.RoomCount(ctx); err != nil {
			return RoomsPage{}, err
		}
	} else {
		ids, err := m.st.RoomIDs(ctx)
		if err != nil {
			return RoomsPage{}, err
		}
		sort.Strings(ids)
		page.Total = len(ids)
		i, _ := sort.Find(len(ids), func(i int) int { return strings.Compare(after, ids[i]) })
		for ; i < len(ids) && len(recs) <= limit; i++ {
			if ids[i] == after {
				continue
			}
			rec, err := m.st.Room(ctx, ids[i])
			if errors.Is(err, record.ErrNotFound) {
				continue
			}
			if err != nil {
				return RoomsPage{}, err
			}
			recs = append(recs, rec)
		}
	}
	if len(recs) > limit {
		recs, page.More = recs[:limit], true
	}
	if len(recs) == 0 {
		return page, nil
	}
	// What waits on people is few rows in all rooms: one query each.
	aps, err := m.st.Approvals(ctx, "", true)
	if err != nil {
		return RoomsPage{}, err
	}
	qs, err := m.st.Questions(ctx, "", true)
	if err != nil {
		return RoomsPage{}, err
	}
	byRoom := make(map[string]int, len(recs))
	page.Rooms = make([]State, len(recs))
	for i, rec := range recs {
		page.Rooms[i] = m.liveState(ctx, rec)
		byRoom[rec.ID] = i
	}
	for _, a := range aps {
		if i, ok := byRoom[a.Room]; ok {
			page.Rooms[i].Approvals = append(page.Rooms[i].Approvals, a)
		}
	}
	for _, q := range qs {
		if i, ok := byRoom[q.Room]; ok {
			page.Rooms[i].Questions = append(page.Rooms[i].Questions, q)
		}
	}
	return page, nil
}

// Gauges are the Manager's counts over all rooms.
type Gauges struct {
	Rooms, Resident, Running, Queued, Approvals, Questions int
}

// Gauges counts the rooms, the resident agents, the running turns, the
// queued messages and what waits on people. On one machine with a
// RoomPager Store it reads the rooms held in memory and three counts from
// the store, whatever the number of rooms; otherwise (a Cluster, whose
// other hosts' rooms are read from the store) it reads every room's
// State.
func (m *Manager) Gauges(ctx context.Context) (Gauges, error) {
	var g Gauges
	p, ok := m.st.(RoomPager)
	if !ok || m.opts.Cluster != nil {
		ids, err := m.st.RoomIDs(ctx)
		if err != nil {
			return Gauges{}, err
		}
		g.Rooms = len(ids)
		for _, id := range ids {
			st, err := m.State(ctx, id)
			if err != nil {
				continue
			}
			g.add(st)
		}
		return g, nil
	}
	var err error
	if g.Rooms, err = p.RoomCount(ctx); err != nil {
		return Gauges{}, err
	}
	// A room not held in memory has no agent, turn or queue.
	m.mu.Lock()
	held := make([]*roomState, 0, len(m.rooms))
	for _, r := range m.rooms {
		held = append(held, r)
	}
	m.mu.Unlock()
	for _, r := range held {
		r.mu.Lock()
		if r.agent != nil {
			g.Resident++
		}
		if r.turn != nil {
			g.Running++
		}
		g.Queued += r.queuedLocked()
		r.mu.Unlock()
	}
	aps, err := m.st.Approvals(ctx, "", true)
	if err != nil {
		return Gauges{}, err
	}
	qs, err := m.st.Questions(ctx, "", true)
	if err != nil {
		return Gauges{}, err
	}
	g.Approvals, g.Questions = len(aps), len(qs)
	return g, nil
}

func (g *Gauges) add(st State) {
	if st.Resident {
		g.Resident++
	}
	if st.Turn != nil {
		g.Running++
	}
	g.Queued += st.Queued
	g.Approvals += len(st.Approvals)
	g.Questions += len(st.Questions)
}

// EventTapper is a Store that reports the events it commits (the SQLite
// store does). Tap calls fn after each commit that appended events, in
// any room, with those events in order (their Data shared: fn must not
// change it), until stop is called; fn runs between one commit and the
// next, so it must be quick and must not write.
type EventTapper interface {
	Tap(fn func([]record.Event)) (stop func())
}

// TapEvents calls fn with the events of each commit, in every room, when
// the Store can report them (ok); see EventTapper for what fn may do.
func (m *Manager) TapEvents(fn func([]record.Event)) (stop func(), ok bool) {
	t, ok := m.st.(EventTapper)
	if !ok {
		return func() {}, false
	}
	return t.Tap(fn), true
}

// Rooms lists the ids of every room the store knows.
func (m *Manager) Rooms(ctx context.Context) ([]string, error) { return m.st.RoomIDs(ctx) }

// Events returns the room's events after seq after, in order, at most
// limit (0, or over record.MaxPage: record.MaxPage).
func (m *Manager) Events(ctx context.Context, room string, after int64, limit int) ([]record.Event, error) {
	if err := ValidateID(room); err != nil {
		return nil, err
	}
	return m.st.Events(ctx, room, after, limit)
}

// Watch signals new events in the room: the channel receives a value
// after each commit that appended some (several may coalesce into one),
// and is closed when the store closes; the func stops the watch. Read
// what is new with Events after the last sequence seen.
func (m *Manager) Watch(room string) (<-chan struct{}, func()) { return m.st.Watch(room) }

// Turns returns the room's turns with their outcome and final text, in
// order of the message each consumed first (see Store.Turns).
func (m *Manager) Turns(ctx context.Context, room string, after int64, limit int) ([]record.Turn, error) {
	if err := ValidateID(room); err != nil {
		return nil, err
	}
	return m.st.Turns(ctx, room, after, limit)
}

// Messages returns the room's messages with their status and outcome.
func (m *Manager) Messages(ctx context.Context, room string, after int64, limit int) ([]record.Message, error) {
	if err := ValidateID(room); err != nil {
		return nil, err
	}
	return m.st.Messages(ctx, room, after, limit)
}
