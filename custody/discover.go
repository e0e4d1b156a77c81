package custody

import (
	"context"
	"fmt"
	"runtime"
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
// none) that backs off, and a look at the scope for processes born
// meanwhile at least every closeLookEvery.
const (
	closePollMin   = 2 * time.Millisecond
	closePollMax   = 50 * time.Millisecond
	closeLookEvery = 100 * time.Millisecond
)

// The discovery loop looks at every open scope every ScanInterval, and
// spends at most about 1/dutyFactor of a core on it: with many scopes
// open, a look takes long, and the next waits longer. It does not back off
// merely because nothing changed: a look at a few scopes costs little, and
// a longer wait lets more short-lived processes (a background job the
// agent ends itself) go unseen and off the receipt. A scope whose leader
// started or exited is looked at on its own at once. The whole process
// table is read only by a host without the subreaper flag, whose orphans
// leave its view (and by reap).
const dutyFactor = 100

// poke has the loop look at s soon.
func (c *Custodian) poke(s *Scope) {
	c.mu.Lock()
	c.poked[s] = struct{}{}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// discoverLoop looks at the open scopes while any is open.
func (c *Custodian) discoverLoop() {
	defer c.loopWG.Done()
	t := time.NewTimer(c.opts.ScanInterval)
	defer t.Stop()
	next := time.Now().Add(c.opts.ScanInterval)
	for {
		select {
		case <-c.quit:
			return
		case <-t.C:
		case <-c.kick:
			c.lookPoked()
			if time.Now().Before(next) {
				t.Reset(time.Until(next))
				continue
			}
		}
		// The cost is the CPU the look took (its thread's clock), not its
		// wall time: on a busy machine the wall time says nothing about
		// what the look costs, and the loop would back off for nothing.
		runtime.LockOSThread()
		t0 := threadCPU()
		c.scan()
		cost := threadCPU() - t0
		runtime.UnlockOSThread()
		c.finishFailed()
		wait := max(c.opts.ScanInterval, dutyFactor*cost)
		next = time.Now().Add(wait)
		t.Reset(wait)
	}
}

// lookPoked looks at the scopes poked since the last time.
func (c *Custodian) lookPoked() {
	c.mu.Lock()
	var targets []*Scope
	for s := range c.poked {
		if _, open := c.scopes[s]; open {
			targets = append(targets, s)
		}
	}
	clear(c.poked)
	c.mu.Unlock()
	if len(targets) > 0 {
		c.look(c.openScopes(), targets, c.opts.NoSubreaper, false)
	}
}

func (c *Custodian) openScopes() []*Scope {
	c.mu.Lock()
	defer c.mu.Unlock()
	scopes := make([]*Scope, 0, len(c.scopes))
	for s := range c.scopes {
		scopes = append(scopes, s)
	}
	return scopes
}

// scan looks at every open scope.
func (c *Custodian) scan() {
	if scopes := c.openScopes(); len(scopes) > 0 {
		c.look(scopes, scopes, c.opts.NoSubreaper, false)
	}
}

// lookAt looks at one scope, deep: the children of every process it owns
// are read, those in its cgroup too (Close and Signal).
func (c *Custodian) lookAt(s *Scope) {
	c.look(c.openScopes(), []*Scope{s}, c.opts.NoSubreaper, true)
}

// look updates the target scopes from one read of the processes they lead
// to: what each owns, the members of its cgroup (and of the groups below
// it), the children of its owned processes, and the host's children (the
// orphans it inherits). Only what a scope owns is read, never the whole
// machine, unless full (a host without the subreaper flag). Newcomers are assigned to any open scope; a scope
// that is closing signals them at once (see assign). deep reads the
// children of processes in a scope's cgroup as well: without it they are
// left to the cgroup, which their children are born into.
func (c *Custodian) look(all, targets []*Scope, full, deep bool) {
	c.scanMu.Lock()
	defer c.scanMu.Unlock()
	var t *procTable
	if full {
		t = c.plat.table()
		if t != nil {
			t.members = map[int]*Scope{}
			for _, s := range all {
				for pid := range s.cg.members() {
					t.members[pid] = s
				}
			}
		}
	} else {
		t = c.gather(all, targets, deep)
	}
	if t != nil && (t.full || !known(t, targets)) {
		adopted := c.assign(t, all)
		for !t.full && len(adopted) > 0 {
			// The newcomers' own children, until a round adopts nothing.
			c.signalAdopted(adopted)
			n := len(t.byStart)
			for _, a := range adopted {
				if pi, ok := t.lookup(a.o.id); ok && (a.walk || deep) {
					for _, pid := range c.plat.children(pi, nil) {
						t.add(pid)
					}
				}
			}
			if len(t.byStart) == n {
				break
			}
			t.sortByStart()
			adopted = c.assign(t, all)
		}
		if t.full && len(adopted) > 0 {
			c.signalAdopted(adopted)
		}
	}
	now := time.Now()
	for _, s := range targets {
		s.refresh(t, nil, now)
		s.lookedAt.Store(now.UnixNano())
	}
}

// gather reads what the targets lead to into a table (nil where the
// platform has no /proc): their owned processes (live, and those gone but
// possibly still in a table), their cgroups' members, the children of
// owned processes outside their scope's cgroup (all of them when deep, or
// without a cgroup), then the host's children. The host's children come
// last: an orphan whose parent died while its parent's children were read
// has been reparented to the host by then.
func (c *Custodian) gather(all, targets []*Scope, deep bool) *procTable {
	t := c.plat.newTable()
	if t == nil {
		return nil
	}
	t.stat = c.plat.stat
	t.members = map[int]*Scope{}
	var walk []procInfo
	var ids []ident
	for _, s := range targets {
		in := s.cg.members()
		for pid := range in {
			t.members[pid] = s
		}
		s.mu.Lock()
		ids = ids[:0]
		for id := range s.live {
			ids = append(ids, id)
		}
		nlive := len(ids)
		for id := range s.dead {
			ids = append(ids, id)
		}
		s.mu.Unlock()
		for i, id := range ids {
			pi, ok := t.add(id.pid)
			if i < nlive && ok && pi.start == id.start && (deep || !in[id.pid]) {
				walk = append(walk, pi)
			}
		}
		for pid := range in {
			t.add(pid)
		}
	}
	var pids []int
	for _, pi := range walk {
		pids = c.plat.children(pi, pids[:0])
		for _, pid := range pids {
			t.add(pid)
		}
	}
	// The host's children, but not the leaders (their own scopes read
	// them): the orphans the host inherited.
	pids = c.plat.hostChildren(pids[:0])
	hostChildren.mu.Lock()
	orphans := pids[:0]
	for _, pid := range pids {
		if !hostChildren.leaders[pid] {
			orphans = append(orphans, pid)
		}
	}
	hostChildren.mu.Unlock()
	for _, pid := range orphans {
		t.add(pid)
	}
	t.sortByStart()
	return t
}

// known says whether every process in t is one the targets own or had
// (then nothing is to be assigned: a look at a closing scope among many
// need not index every scope).
func known(t *procTable, targets []*Scope) bool {
	self := -1
	if len(targets) > 0 {
		self = targets[0].c.plat.selfPid()
	}
	for _, p := range t.byStart {
		if p.pid == self {
			continue
		}
		id, mine := ident{p.pid, p.start}, false
		for _, s := range targets {
			s.mu.Lock()
			_, live := s.live[id]
			_, dead := s.dead[id]
			s.mu.Unlock()
			if mine = live || dead; mine {
				break
			}
		}
		if !mine {
			return false
		}
	}
	return true
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

// adoption is a process a look took into a scope: walk says its children
// are to be read (it is not in its scope's cgroup), sig is the signal its
// closing scope owes it (0: none).
type adoption struct {
	s    *Scope
	o    *owned
	walk bool
	sig  sysSignal
}

// signalAdopted sends each newcomer of a closing scope the signal of the
// scope's phase at once (SIGTERM while Close waits out TermGrace, SIGKILL
// after): Close signals at the phase changes only, and a process found
// later would otherwise run unsignalled until Close gives up on it.
func (c *Custodian) signalAdopted(adopted []adoption) {
	for _, a := range adopted {
		if a.sig == 0 {
			continue
		}
		if c.plat.signal(a.o.id, a.sig) {
			a.s.mu.Lock()
			if o := a.s.live[a.o.id]; o != nil {
				o.gone, o.at, o.ended = true, time.Now(), EndedAlreadyGone
				delete(a.s.live, o.id)
			}
			a.s.mu.Unlock()
		}
	}
}

// assign takes every process not yet owned into the scope it belongs to,
// repeating until a pass assigns nothing, so the table's order (children
// can share their parent's start tick) does not matter. Every way of
// finding a process is checked against identities (pid and start time),
// never a bare pid. It returns what it took.
func (c *Custodian) assign(t *procTable, scopes []*Scope) []adoption {
	n := 0
	for _, s := range scopes {
		s.mu.Lock()
		n += len(s.live) + len(s.dead)
		s.mu.Unlock()
	}
	byMarker := make(map[string]*Scope, len(scopes))
	byIdent := make(map[ident]*Scope, n) // every live owned process
	groups := make(map[int]groupRef, n)  // pid of an owned group or session leader
	byCgroup := make(map[string]*Scope, len(scopes))
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
		s.mu.Unlock()
	}
	self := c.plat.selfPid()
	hostSid := c.plat.hostSession()
	selfStart := c.selfStart

	// The host's inherited children are decided under hostChildren.mu, so
	// a leader being started is never among them.
	hostChildren.mu.Lock()
	defer hostChildren.mu.Unlock()

	pending := make([]int, 0, len(t.byStart)) // indexes into t.byStart
	for i, p := range t.byStart {
		if p.pid == self || byIdent[ident{p.pid, p.start}] != nil {
			continue
		}
		if p.dead() && p.ppid != self {
			continue // dead, and its own parent reaps it
		}
		pending = append(pending, i)
	}
	var adopted []adoption
	for changed := true; changed; {
		changed = false
		rest := pending[:0]
		for _, i := range pending {
			p := t.byStart[i]
			s, found := c.belongs(t, p, byIdent, groups, byMarker, byCgroup, self, selfStart, hostSid)
			if s == nil {
				rest = append(rest, i)
				continue
			}
			id := ident{p.pid, p.start}
			cmd, cut := boundCmdline(t.cmdline(p))
			o := &owned{id: id, cmdline: cmd, cut: cut, found: found, lastSeen: t.tick, bornDead: p.dead(), comm: p.comm}
			a := adoption{s: s, o: o, walk: t.members[p.pid] != s}
			s.mu.Lock()
			s.procs[id] = o
			s.live[id] = o
			s.seen++
			if p.pgid == p.pid || p.sid == p.pid {
				s.groups[p.pid] = o // newer than any entry it replaces
				groups[p.pid] = groupRef{s, o}
			}
			if !o.bornDead {
				switch {
				case s.phase == 2:
					a.sig = sigTerm
				case s.phase == 3:
					a.sig = sigKill
				}
			}
			s.mu.Unlock()
			if !o.bornDead {
				// Where rlimits stand in for the scope's limits (custody
				// knows no better moment for a process it did not start).
				s.res.started(p.pid)
			}
			byIdent[id] = s
			adopted = append(adopted, a)
			changed = true
		}
		pending = rest
	}
	// What is left and is the host's zombie child, inherited (not a leader
	// and not in the host's session) but not attributable to one scope, is
	// reaped all the same: nobody else will.
	for _, i := range pending {
		p := t.byStart[i]
		if p.dead() && p.ppid == self && !hostChildren.leaders[p.pid] && p.sid != hostSid {
			c.plat.reap(ident{p.pid, p.start})
		}
	}
	return adopted
}

// belongs finds the scope p belongs to, and how, or nil.
func (c *Custodian) belongs(t *procTable, p procInfo, byIdent map[ident]*Scope, groups map[int]groupRef, byMarker, byCgroup map[string]*Scope, self int, selfStart uint64, hostSid int) (*Scope, Found) {
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
	if s := t.members[p.pid]; s != nil {
		return s, FoundCgroup
	}
	if !p.dead() {
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
// looked up in it (it must hold every live process of the scope that is
// still there); otherwise (t nil) each is read on its own through lookup,
// or, without either, only the leader's exit is seen. The scope's group
// leaders are dropped once no process can be in their group.
func (s *Scope) refresh(t *procTable, lookup func(ident) (procInfo, bool), now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	self := s.c.plat.selfPid()
	for id, o := range s.live {
		if id == s.leader {
			select {
			case <-s.exited:
				o.status = leaderStatus(s.cmd.ProcessState)
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
		case p.dead() && p.ppid == self:
			if gone, st := s.c.plat.reap(id); gone {
				o.status = st
				s.markGone(o, now, true)
			}
		case p.dead():
			s.markGone(o, now, false) // dead; its parent reaps it (see dead)
		case p.comm != o.comm || o.cmdline == "?":
			// It exec'd since its command line was read, or it was
			// read mid-exec (empty): read it again.
			o.cmdline, o.cut = boundCmdline(readCmdline(p))
			o.comm = p.comm
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
		if !d.o.reaped && p.dead() && p.ppid == self {
			if gone, st := s.c.plat.reap(id); gone {
				d.o.reaped = true
				if !d.o.status.known {
					d.o.status = st
				}
			}
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

// markGone records that o went, and how: by the phase Close was in when it
// went; or, for a process first seen already dead, by its exit status where
// this host reaped it (it may have ended long before any signal).
func (s *Scope) markGone(o *owned, at time.Time, reaped bool) {
	o.gone, o.at, o.reaped = true, at, reaped
	delete(s.live, o.id)
	s.dead[o.id] = deadEntry{o, time.Now()}
	switch {
	case o.bornDead:
		switch {
		case o.status.signal == sigTerm && s.phase >= 2:
			o.ended = EndedTerm
		case o.status.signal == sigKill && s.phase >= 3:
			o.ended = EndedKill
		case o.status.known || s.phase < 2:
			o.ended = EndedSelf
		default:
			o.ended = EndedAlreadyGone // it died unseen, maybe of a signal of ours
		}
	case s.phase <= 1:
		o.ended = EndedSelf
	case s.phase == 2:
		o.ended = EndedTerm
	default:
		o.ended = EndedKill
	}
	s.forget(o)
}

// maxKeptExited bounds the processes kept on a scope's receipt that ended
// on their own while it ran (an agent's session may run many thousands of
// commands); later ones are only counted. Processes Close ended are kept.
const maxKeptExited = 256

// forget drops o from the receipt, counting it, once the receipt keeps
// maxKeptExited processes that ended on their own.
func (s *Scope) forget(o *owned) {
	if o.ended != EndedSelf || s.phase > 1 || o.id == s.leader {
		return
	}
	if s.keptExited < maxKeptExited {
		s.keptExited++
		return
	}
	delete(s.procs, o.id)
	if s.forgot == nil {
		s.forgot = map[Ended]int{}
	}
	s.forgot[o.ended]++
}

// waitAllGone waits until every owned process is gone (and a look then
// finds nothing new) or d passes; ctx ending is an error. It waits on the exits themselves (pidfds, where the
// platform has them) with a backoff, checks only the scope's own live
// processes in between, and looks at the scope at least every
// closeLookEvery for processes born meanwhile, which are signalled as soon
// as they are found.
func (s *Scope) waitAllGone(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	w := s.c.plat.exitWaiter()
	defer w.close()
	backoff := closePollMin
	confirmed := false
	for {
		if s.allGone() {
			if confirmed {
				return nil
			}
			// One more look before saying so: what it finds (born before
			// this phase's signal round, say) gets the phase's signal and
			// is waited for too.
			s.c.lookAt(s)
			confirmed = true
			continue
		}
		confirmed = false
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
		if now := time.Now(); now.Sub(time.Unix(0, s.lookedAt.Load())) >= closeLookEvery {
			s.c.lookAt(s)
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
