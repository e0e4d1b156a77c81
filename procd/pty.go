//go:build unix

package procd

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/creack/pty"
)

// subQueue and subMaxPending bound one subscriber's pending events and
// their output bytes; a subscriber that falls further behind is dropped
// (told so when it can still be), never waited for.
const (
	subQueue      = 256
	subMaxPending = 1 << 20
)

type ptyState struct {
	ptmx *os.File
	inMu sync.Mutex // one writer to the terminal at a time

	mu         sync.Mutex
	buf        []byte // the last ReplayLimit to 2*ReplayLimit bytes of output
	base, end  int64  // absolute offsets of buf's start and end
	cols, rows uint16
	subs       map[*ptySub]struct{}
	controller *ptySub
	// exit is set when the exit was emitted: a later subscriber gets it
	// after its replay.
	exit *Exit
}

type ptySub struct {
	conn    *conn
	pending int // output bytes queued, under ptyState.mu
	ch      chan Reply
	dropped chan struct{} // closed when dropped for being slow
}

func (t *ptyState) info() *PTYInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	return &PTYInfo{Cols: t.cols, Rows: t.rows, Offset: t.end, Controller: t.controller != nil}
}

// emit queues r to every subscriber; t.mu held. A full queue drops the
// subscriber.
func (t *ptyState) emit(r Reply) {
	for s := range t.subs {
		if s.pending+len(r.Data) > subMaxPending {
			t.dropLocked(s)
			continue
		}
		select {
		case s.ch <- r:
			s.pending += len(r.Data)
		default:
			t.dropLocked(s)
		}
	}
}

func (t *ptyState) dropLocked(s *ptySub) {
	if _, ok := t.subs[s]; !ok {
		return
	}
	delete(t.subs, s)
	close(s.dropped)
	// Its socket may be full: closing it frees a send blocked on it.
	s.conn.Close()
	if t.controller == s {
		t.controller = nil
		t.emit(Reply{Type: TypeControllerChanged, Controller: false})
	}
}

func (t *ptyState) detach(s *ptySub) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.subs[s]; !ok {
		return
	}
	delete(t.subs, s)
	if t.controller == s {
		t.controller = nil
		t.emit(Reply{Type: TypeControllerChanged, Controller: false})
	}
}

func (t *ptyState) append(data []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	off := t.end
	t.buf = append(t.buf, data...)
	t.end += int64(len(data))
	// Compacted only past twice the limit, so each byte is copied at most
	// once more; replay serves the last ReplayLimit bytes (replayStart).
	if over := len(t.buf) - ReplayLimit; len(t.buf) > 2*ReplayLimit {
		n := copy(t.buf, t.buf[over:])
		t.buf = t.buf[:n]
		t.base += int64(over)
	}
	t.emit(Reply{Type: TypeOutput, Offset: off, Data: append([]byte(nil), data...)})
}

// write writes to the terminal; from is the subscription writing (nil: a
// plain write request), refused while someone else controls it.
func (t *ptyState) write(from *ptySub, data []byte) error {
	t.mu.Lock()
	ctl := t.controller
	t.mu.Unlock()
	if ctl != nil && ctl != from {
		return errf(codeForbidden, "forbidden: another client controls this terminal")
	}
	t.inMu.Lock()
	defer t.inMu.Unlock()
	_ = t.ptmx.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := t.ptmx.Write(data); err != nil {
		return errf(codeFailed, "write: terminal: %v", errors.Unwrap(err))
	}
	return nil
}

func (t *ptyState) resize(from *ptySub, cols, rows uint16) error {
	if cols == 0 || rows == 0 {
		return invalid("resize", "cols and rows must be positive")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.controller != nil && t.controller != from {
		return errf(codeForbidden, "forbidden: another client controls this terminal")
	}
	if err := pty.Setsize(t.ptmx, &pty.Winsize{Cols: cols, Rows: rows}); err != nil {
		return errf(codeFailed, "resize: %v", err)
	}
	t.cols, t.rows = cols, rows
	t.emit(Reply{Type: TypeResized, Cols: cols, Rows: rows})
	return nil
}

func (d *daemon) opCreatePTY(c *conn, op string, raw json.RawMessage) error {
	var s struct {
		Op string `json:"op"`
		PTYSpec
	}
	if err := decode(op, raw, &s); err != nil {
		return err
	}
	if err := checkCommon(op, s.Argv, s.Cwd, s.Env, s.Metadata); err != nil {
		return err
	}
	if s.Cols == 0 {
		s.Cols = 80
	}
	if s.Rows == 0 {
		s.Rows = 24
	}
	ptmx, tty, err := pty.Open()
	if err != nil {
		return errf(codeFailed, "create_pty: %v", err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: s.Cols, Rows: s.Rows}); err != nil {
		ptmx.Close()
		tty.Close()
		return errf(codeFailed, "create_pty: %v", err)
	}
	t := &ptyState{ptmx: ptmx, cols: s.Cols, rows: s.Rows, subs: map[*ptySub]struct{}{}}
	p := &proc{id: "t-" + randHex(8), mode: ModePTY, argv: s.Argv, cwd: s.Cwd, metadata: s.Metadata, limits: s.Limits,
		exited: make(chan struct{}), ended: make(chan struct{}), done: make(chan struct{}), pty: t}
	err = d.startProc(p, func(ctx context.Context) (*custody.Scope, error) {
		return d.cust.StartWith(ctx, command(s.Argv, s.Cwd, s.Env), custody.StartOptions{Limits: limitsOf(s.Limits), TTY: tty})
	})
	tty.Close() // the child has it
	if err != nil {
		ptmx.Close()
		return err
	}
	d.wg.Add(1)
	go d.runPTY(p)
	d.mu.Lock()
	info := d.info(p)
	d.mu.Unlock()
	return c.send(Reply{Type: TypeProcess, Process: &info})
}

// runPTY reads the terminal into the replay buffer and the subscribers;
// the exit is published after the leader exited and the terminal reached
// EOF (or ExitDrain passed).
func (d *daemon) runPTY(p *proc) {
	defer d.wg.Done()
	defer close(p.done)
	t := p.pty
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 32<<10)
		for {
			n, err := t.ptmx.Read(buf)
			if n > 0 {
				t.append(buf[:n])
			}
			if err != nil {
				return // EIO once every holder of the child end is gone
			}
		}
	}()
	d.awaitOutput(p, readerDone, func() { t.ptmx.Close() })
	t.mu.Lock()
	end := t.end
	t.mu.Unlock()
	d.publishExit(p, 0, "", end)
	d.mu.Lock()
	e := *p.exit
	d.mu.Unlock()
	t.mu.Lock()
	t.exit = &e
	t.emit(Reply{Type: TypeExited, Exit: &e})
	t.mu.Unlock()
	// The terminal is closed when the record is terminated.
	<-p.ended
	t.ptmx.Close()
}

func (d *daemon) opResize(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op   string `json:"op"`
		ID   string `json:"id"`
		Cols uint16 `json:"cols"`
		Rows uint16 `json:"rows"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	p, err := d.lookup(op, r.ID)
	if err != nil {
		return err
	}
	if p.pty == nil {
		return invalid(op, "%s is not a pty", r.ID)
	}
	if err := p.pty.resize(nil, r.Cols, r.Rows); err != nil {
		return err
	}
	return c.send(Reply{Type: TypeOK})
}

// opSubscribe attaches c to a pty: the replay from the asked offset, then
// live output; input and resize frames from the controller.
func (d *daemon) opSubscribe(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op      string `json:"op"`
		ID      string `json:"id"`
		Offset  int64  `json:"offset"`
		Control bool   `json:"control"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	if r.Offset < 0 {
		return invalid(op, "offset must not be negative")
	}
	p, err := d.lookup(op, r.ID)
	if err != nil {
		return err
	}
	t := p.pty
	if t == nil {
		return invalid(op, "%s is not a pty (a pipe process's output is its file)", r.ID)
	}
	s := &ptySub{conn: c, ch: make(chan Reply, subQueue), dropped: make(chan struct{})}
	t.mu.Lock()
	start := max(t.base, t.end-ReplayLimit)
	from := min(max(r.Offset, start), t.end)
	att := Reply{Type: TypeAttached, Offset: from, Truncated: r.Offset < start,
		Data: append([]byte(nil), t.buf[from-t.base:]...), Cols: t.cols, Rows: t.rows}
	if r.Control {
		if t.controller != nil {
			t.emit(Reply{Type: TypeControllerChanged, Controller: false})
		}
		t.controller = s
	}
	att.Controller = t.controller == s
	t.subs[s] = struct{}{}
	if t.exit != nil {
		// It exited before: the exit follows the replay at once (the
		// queue is empty, so this never blocks).
		s.ch <- Reply{Type: TypeExited, Exit: t.exit}
	}
	t.mu.Unlock()
	defer t.detach(s)
	d.mu.Lock()
	p.watchers++
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		p.watchers--
		p.touched = time.Now()
		d.mu.Unlock()
	}()
	if err := c.send(att); err != nil {
		return nil
	}
	// Frames from the subscriber: input and resize.
	gone := make(chan struct{})
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(gone)
		for {
			op, raw, err := d.readRequest(c)
			if err != nil {
				var re *reqErr
				if errors.As(err, &re) {
					c.fail(re.code, re.msg)
					continue
				}
				return
			}
			if err := d.subRequest(t, s, op, raw); err != nil {
				var re *reqErr
				if errors.As(err, &re) {
					c.fail(re.code, re.msg)
				}
			}
		}
	}()
	for {
		select {
		case ev := <-s.ch:
			t.mu.Lock()
			s.pending -= len(ev.Data)
			t.mu.Unlock()
			_ = c.SetWriteDeadline(time.Now().Add(writeTimeout))
			if c.send(ev) != nil {
				return nil
			}
			if ev.Type == TypeExited {
				// Output ends here; the subscription stays for the
				// last frames already queued.
				continue
			}
		case <-s.dropped:
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_ = c.send(Reply{Type: TypeDropped, Message: "subscriber too slow"})
			c.Close()
			<-gone
			return nil
		case <-gone:
			return nil
		case <-p.ended:
			c.Close()
			<-gone
			return nil
		case <-d.quit:
			c.Close()
			<-gone
			return nil
		}
	}
}

func (d *daemon) subRequest(t *ptyState, s *ptySub, op string, raw json.RawMessage) error {
	switch op {
	case "input":
		var r struct {
			Op   string `json:"op"`
			Data []byte `json:"data"`
		}
		if err := decode(op, raw, &r); err != nil {
			return err
		}
		t.mu.Lock()
		ctl := t.controller == s
		t.mu.Unlock()
		if !ctl {
			return errf(codeForbidden, "forbidden: input needs control of the terminal")
		}
		return t.write(s, r.Data)
	case "resize":
		var r struct {
			Op   string `json:"op"`
			Cols uint16 `json:"cols"`
			Rows uint16 `json:"rows"`
		}
		if err := decode(op, raw, &r); err != nil {
			return err
		}
		t.mu.Lock()
		ctl := t.controller == s
		t.mu.Unlock()
		if !ctl {
			return errf(codeForbidden, "forbidden: resize needs control of the terminal")
		}
		return t.resize(s, r.Cols, r.Rows)
	}
	return errf(codeUnsupported, "unsupported request: %s (on a subscription only input and resize)", op)
}
