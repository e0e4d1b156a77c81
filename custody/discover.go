package custody

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// hostChildren is what custody knows about the host's direct children
// across every Custodian in the process: the subreaper flag belongs to the
// process, so an orphan may be inherited from any Custodian's scope.
//
// mu is held while a leader is forked and registered, and while a scan
// decides about the host's children, so a leader (whose exit status is
// exec.Cmd.Wait's) is never taken for an inherited orphan.
var hostChildren = struct {
	mu      sync.Mutex
	leaders map[int]bool        // pids exec.Cmd waits for; never reaped here
	scopes  map[*Scope]struct{} // every open scope of every Custodian
}{leaders: map[int]bool{}, scopes: map[*Scope]struct{}{}}

// Waiting for exits during Close: a pidfd poll (or a sleep where there is
// none) that backs off, and a full discovery scan only when none (the
// discovery loop's included) ran for closeScanEvery.
const (
	closePollMin   = 2 * time.Millisecond
	closePollMax   = 50 * time.Millisecond
	closeScanEvery = 250 * time.Millisecond
)

func (c *Custodian) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// discoverLoop scans for descendants while scopes are open.
func (c *Custodian) discoverLoop() {
	defer c.loopWG.Done()
	t := time.NewTicker(c.opts.ScanInterval)
	defer t.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-t.C:
		case <-c.kick:
		}
		c.scan()
	}
}

// scan reads the process table once and updates every open scope: new
// descendants are assigned (until nothing changes), then each scope's live
// processes are checked against the same table.
func (c *Custodian) scan() {
	c.scanMu.Lock()
	defer c.scanMu.Unlock()
	c.mu.Lock()
	scopes := make([]*Scope, 0, len(c.scopes))
	for s := range c.scopes {
		scopes = append(scopes, s)
	}
	c.mu.Unlock()
	if len(scopes) == 0 {
		return
	}
	t := c.plat.table()
	now := time.Now()
	c.lastScan.Store(now.UnixNano())
	if t != nil {
		c.assign(t, scopes)
	}
	for _, s := range scopes {
		s.refresh(t, nil, now)
	}
}

// deadEntry is a process gone since at, kept until a table read after at
// no longer has it.
type deadEntry struct {
	o  *owned
	at time.Time
}

// groupRef is an owned process that leads a process group or session: the
// group's id is its pid, and the group is the scope's only while that pid
// cannot have been reused (see owns).
type groupRef struct {
	s *Scope
	o *owned
}

// owns says whether p's group or session id gid names the group of the
// owned leader g. A group id outlives its leader while members remain, and
// a pid is not reused while it names a group, so the group is g's if g
// holds the pid now, or if p was born while g was known to hold it (p
// inherited the group then). A process born after g was last seen may be in
// a new group of a process that took g's pid: it is not taken.
func owns(t *procTable, g *owned, p procInfo) bool {
	if cur, ok := t.byPid[g.id.pid]; ok && t.byStart[cur].start == g.id.start {
		return true
	}
	return p.start >= g.id.start && p.start < g.lastSeen
}

// assign takes every process not yet owned into the scope it belongs to,
// repeating until a pass assigns nothing, so the table's order (children
// can share their parent's start tick) does not matter. Every way of
// finding a process is checked against identities (pid and start time),
// never a bare pid.
func (c *Custodian) assign(t *procTable, scopes []*Scope) {
	byMarker := map[string]*Scope{}
	byIdent := map[ident]*Scope{} // every live owned process
	groups := map[int]groupRef{}  // pid of an owned group or session leader
	byCgroup := map[string]*Scope{}
	var members map[int]*Scope
	for _, s := range scopes {
		s.mu.Lock()
		byMarker[s.marker] = s
		for id := range s.live {
			byIdent[id] = s
		}
		for id := range s.dead {
			byIdent[id] = s // dead already: never adopted again
		}
		for pid, o := range s.groups {
			// Of two leaders that held one pid, only the newer can lead a
			// group that still has members.
			if g, ok := groups[pid]; !ok || g.o.id.start < o.id.start {
				groups[pid] = groupRef{s, o}
			}
		}
		if s.cg != nil {
			byCgroup[s.cg.rel] = s
		}
		// cgroup.procs is read only while a scope closes: its members are
		// found by the other means meanwhile, and the read is not free.
		if s.phase > 0 {
			for pid := range s.cg.members() {
				if members == nil {
					members = map[int]*Scope{}
				}
				members[pid] = s
			}
		}
		s.mu.Unlock()
	}
	self := c.plat.selfPid()
	hostSid := c.plat.hostSession()
	selfStart := uint64(0)
	if i, ok := t.byPid[self]; ok {
		selfStart = t.byStart[i].start
	}

	// The host's inherited children are decided under hostChildren.mu, so
	// a leader being started is never among them.
	hostChildren.mu.Lock()
	defer hostChildren.mu.Unlock()

	pending := make([]int, 0, len(t.byStart)) // indexes into t.byStart
	for i, p := range t.byStart {
		if p.pid == self || byIdent[ident{p.pid, p.start}] != nil {
			continue
		}
		if p.state == 'Z' && p.ppid != self {
			continue // dead, and its own parent reaps it
		}
		pending = append(pending, i)
	}
	for changed := true; changed; {
		changed = false
		rest := pending[:0]
		for _, i := range pending {
			p := t.byStart[i]
			s, found := c.belongs(t, p, byIdent, groups, members, byMarker, byCgroup, self, selfStart, hostSid)
			if s == nil {
				rest = append(rest, i)
				continue
			}
			id := ident{p.pid, p.start}
			o := &owned{id: id, cmdline: t.cmdline(p), found: found, lastSeen: t.tick}
			s.mu.Lock()
			s.procs[id] = o
			s.live[id] = o
			if p.pgid == p.pid || p.sid == p.pid {
				s.groups[p.pid] = o // newer than any entry it replaces
				groups[p.pid] = groupRef{s, o}
			}
			s.mu.Unlock()
			byIdent[id] = s
			changed = true
		}
		pending = rest
	}
	// What is left and is the host's zombie child, inherited (not a leader
	// and not in the host's session) but not attributable to one scope, is
	// reaped all the same: nobody else will.
	for _, i := range pending {
		p := t.byStart[i]
		if p.state == 'Z' && p.ppid == self && !hostChildren.leaders[p.pid] && p.sid != hostSid {
			c.plat.reap(ident{p.pid, p.start})
		}
	}
}

// belongs finds the scope p belongs to, and how, or nil.
func (c *Custodian) belongs(t *procTable, p procInfo, byIdent map[ident]*Scope, groups map[int]groupRef, members map[int]*Scope, byMarker, byCgroup map[string]*Scope, self int, selfStart uint64, hostSid int) (*Scope, Found) {
	for _, gid := range [2]int{p.pgid, p.sid} {
		if g, ok := groups[gid]; ok && owns(t, g.o, p) {
			return g.s, FoundGroup
		}
	}
	if j, ok := t.byPid[p.ppid]; ok && p.ppid != self {
		if s := byIdent[ident{p.ppid, t.byStart[j].start}]; s != nil {
			return s, FoundParent
		}
	}
	if s := members[p.pid]; s != nil {
		return s, FoundCgroup
	}
	if p.state != 'Z' {
		if s := byMarker[t.marker(p)]; s != nil {
			return s, FoundMarker
		}
	}
	if p.ppid != self || hostChildren.leaders[p.pid] || p.sid == hostSid || p.start < selfStart {
		return nil, ""
	}
	// The host's child, not one it started (not a leader, not in the
	// host's session): an orphan it inherited as the subreaper. Its
	// cgroup names its scope even after it exited; otherwise it is
	// the only open scope that could have started it.
	if len(byCgroup) > 0 {
		if s := byCgroup[c.plat.cgroupOf(p.pid)]; s != nil {
			return s, FoundCgroup
		}
	}
	var only *Scope
	for s := range hostChildren.scopes {
		if s.leader.start <= p.start {
			if only != nil {
				return nil, "" // several could have: not attributed
			}
			only = s
		}
	}
	if only != nil && only.c == c {
		return only, FoundInherited
	}
	return nil, ""
}

// refresh marks live processes gone (they stay on the receipt), reaping
// those that are this host's zombie children. With a table, processes are
// looked up in it; otherwise (t nil) each is read on its own through
// lookup, or, without either, only the leader's exit is seen. The scope's
// group leaders are dropped once no process can be in their group.
func (s *Scope) refresh(t *procTable, lookup func(ident) (procInfo, bool), now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	self := s.c.plat.selfPid()
	for id, o := range s.live {
		if id == s.leader {
			select {
			case <-s.exited:
				s.markGone(o, now, true)
				continue
			default:
			}
		}
		var p procInfo
		var ok bool
		switch {
		case t != nil:
			p, ok = t.lookup(id)
			if ok {
				o.lastSeen = t.tick
			}
		case lookup != nil:
			p, ok = lookup(id)
		default:
			continue
		}
		switch {
		case id == s.leader:
			// Its exit status is cmd.Wait's; it is gone when that returns.
		case !ok:
			s.markGone(o, now, false)
		case p.state == 'Z' && p.ppid == self:
			if s.c.plat.reap(id) {
				s.markGone(o, now, true)
			}
		case p.state == 'Z':
			s.markGone(o, now, false) // dead; its parent reaps it (see dead)
		}
		if ok && (p.pgid == p.pid || p.sid == p.pid) {
			if g := s.groups[id.pid]; g == nil || g.id.start < id.start {
				s.groups[id.pid] = o // it made a group or session of its own
			}
		}
	}
	// A process gone may still be in a table: one read before it was
	// reaped (a scan runs beside Close's own looks), or as a zombie its
	// parent has yet to reap (and which is the host's to reap if its
	// parent exits first). It is kept apart until a table read after it
	// went no longer has it; only scans (one at a time) drop it.
	for id, d := range s.dead {
		var p procInfo
		var ok bool
		switch {
		case t != nil:
			if !t.at.After(d.at) {
				continue // read before it went
			}
			p, ok = t.lookup(id)
			if !ok {
				delete(s.dead, id)
				continue
			}
		case lookup != nil:
			if p, ok = lookup(id); !ok {
				continue
			}
		default:
			delete(s.dead, id) // no tables here to meet it again
			continue
		}
		if !d.o.reaped && p.state == 'Z' && p.ppid == self && s.c.plat.reap(id) {
			d.o.reaped = true
		}
	}
	if t != nil {
		for pid, o := range s.groups {
			if !o.gone {
				continue
			}
			if !t.groupInUse(pid) {
				delete(s.groups, pid)
			}
		}
	}
}

func (s *Scope) markGone(o *owned, at time.Time, reaped bool) {
	o.gone, o.at, o.reaped = true, at, reaped
	delete(s.live, o.id)
	s.dead[o.id] = deadEntry{o, time.Now()}
	switch s.phase {
	case 0, 1:
		o.ended = EndedSelf
	case 2:
		o.ended = EndedTerm
	default:
		o.ended = EndedKill
	}
}

// waitAllGone waits until every owned process is gone or d passes; ctx
// ending is an error. It waits on the exits themselves (pidfds, where the
// platform has them) with a backoff, checks only the scope's own live
// processes in between, and rescans the whole table at most every
// closeScanEvery to find processes born meanwhile.
func (s *Scope) waitAllGone(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	w := s.c.plat.exitWaiter()
	defer w.close()
	backoff := closePollMin
	for {
		if s.allGone() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("custody: close: %w", err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		exited, pending := w.wait(s.liveIdents(), min(backoff, left))
		if exited {
			backoff = closePollMin // more may follow: look again soon
		} else {
			backoff = min(2*backoff, closePollMax)
		}
		if now := time.Now(); now.Sub(time.Unix(0, s.c.lastScan.Load())) >= closeScanEvery {
			s.c.scan()
		} else if exited || pending {
			s.refresh(nil, s.c.plat.lookup, now)
		}
	}
}

func (s *Scope) liveIdents() []ident {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]ident, 0, len(s.live))
	for id := range s.live {
		ids = append(ids, id)
	}
	return ids
}

func (s *Scope) allGone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live) == 0
}

func (s *Scope) aliveList() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for _, o := range s.live {
		parts = append(parts, fmt.Sprintf("pid %d (%s)", o.id.pid, trimCmd(o.cmdline)))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// exitWaiter waits for any of a set of processes to exit.
type exitWaiter interface {
	// wait blocks up to d, or until one of ids exits. exited: one did
	// (or may have) just now; pending: one exited earlier and is still
	// among ids (not yet seen gone). Either makes ids worth a look.
	wait(ids []ident, d time.Duration) (exited, pending bool)
	close()
}
