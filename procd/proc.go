//go:build unix

package procd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agenthost/agenthost/custody"
	"golang.org/x/sys/unix"
)

// writeTimeout bounds one write to a child's stdin that does not read.
const writeTimeout = 30 * time.Second

// proc is one process record.
type proc struct {
	id        string
	seq       uint64 // creation order: list's pages follow it
	mode      Mode
	argv      []string
	cwd       string
	scope     *custody.Scope
	limits    *custody.Limits // as asked (nil: none)
	startedAt time.Time

	exited chan struct{} // closed once exit is set (output complete)
	ended  chan struct{} // closed when the record is terminated
	done   chan struct{} // closed when the process goroutines are finished

	// Under daemon.mu.
	metadata json.RawMessage
	exit     *Exit
	endCode  string // codeTerminated or codeShutdown, once ended
	// exitBeforeEnd: the exit was published before the record was ended.
	exitBeforeEnd bool
	touched       time.Time
	watchers      int

	// Pipe mode.
	stdinMu sync.Mutex
	pipe    *pipeState
	// PTY mode.
	pty *ptyState
}

type pipeState struct {
	outPath, errPath string
	mu               sync.Mutex
	bytes, lines     int64
	errBytes         int64
	outErr           string
	// The files while the process runs (nil once closed), for trim; and
	// how far each was trimmed.
	out, errf              *os.File
	outTrimmed, errTrimmed int64
}

func (d *daemon) info(p *proc) ProcessInfo {
	pi := ProcessInfo{ID: p.id, Mode: p.mode, Argv: p.argv, Cwd: p.cwd, PID: p.scope.Pid(), Running: p.exit == nil,
		StartedAt: p.startedAt, Metadata: p.metadata, Watchers: p.watchers, Limits: p.limits}
	if p.exit != nil {
		e := *p.exit
		pi.Exit, pi.ExitedAt = &e, &e.ExitedAt
	}
	if ps := p.pipe; ps != nil {
		ps.mu.Lock()
		pi.Pipe = &PipeInfo{OutputPath: ps.outPath, StderrPath: ps.errPath, OutputBytes: ps.bytes, OutputLines: ps.lines, OutputError: ps.outErr,
			OutputTrimmed: ps.outTrimmed}
		ps.mu.Unlock()
	}
	if t := p.pty; t != nil {
		pi.PTY = t.info()
	}
	return pi
}

// lookup finds a record and counts the request as attention.
func (d *daemon) lookup(op, id string) (*proc, error) {
	if id == "" {
		return nil, invalid(op, "id is required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.procs[id]
	if p == nil {
		return nil, errf(codeNotFound, "no such process: %s", id)
	}
	p.touched = time.Now()
	return p, nil
}

// lookupRequest decodes a request that names one process and nothing
// else (get, wait, terminate) and finds the process.
func (d *daemon) lookupRequest(op string, raw json.RawMessage) (*proc, error) {
	var r struct {
		Op string `json:"op"`
		ID string `json:"id"`
	}
	if err := decode(op, raw, &r); err != nil {
		return nil, err
	}
	return d.lookup(op, r.ID)
}

// checkCommon validates what both create requests share.
func checkCommon(op string, argv []string, cwd string, env []string, meta json.RawMessage) error {
	if len(argv) == 0 || argv[0] == "" {
		return invalid(op, "argv is required")
	}
	if !filepath.IsAbs(cwd) {
		return invalid(op, "cwd must be an absolute path")
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return invalid(op, "cwd is not a directory")
	}
	for _, e := range env {
		if !strings.Contains(e, "=") || strings.IndexByte(e, 0) >= 0 {
			return invalid(op, "env entries must be KEY=VALUE")
		}
	}
	if len(meta) > MaxMetadata {
		return invalid(op, "metadata is %d bytes, over %d", len(meta), MaxMetadata)
	}
	return nil
}

// command builds the child's command: argv[0] is looked up in the child's
// own PATH (its exact environment), else the daemon's.
func command(argv []string, cwd string, env []string) *exec.Cmd {
	cmd := exec.Command(argv[0], argv[1:]...)
	if !strings.Contains(argv[0], "/") {
		for _, e := range env {
			if path, ok := strings.CutPrefix(e, "PATH="); ok {
				for _, dir := range filepath.SplitList(path) {
					c := filepath.Join(dir, argv[0])
					if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 && filepath.IsAbs(c) {
						cmd.Path, cmd.Err = c, nil
						break
					}
				}
			}
		}
	}
	cmd.Dir = cwd
	cmd.Env = append([]string{}, env...)
	return cmd
}

// openOutput opens an output file: created or truncated (0600: a process's
// output is its owner's alone), never through a symlink, and only a
// regular file (a FIFO would block the daemon).
func openOutput(op, field, path string) (*os.File, error) {
	if !filepath.IsAbs(path) {
		return nil, invalid(op, "%s must be an absolute path", field)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink == 0 && !fi.Mode().IsRegular() {
		return nil, invalid(op, "%s is not a regular file", field)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err == nil {
		// One that was there keeps no looser mode.
		err = f.Chmod(0o600)
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, invalid(op, "%s is a symlink", field)
		}
		return nil, invalid(op, "%s: %v", field, errors.Unwrap(err))
	}
	return f, nil
}

func (d *daemon) opCreatePipe(c *conn, op string, raw json.RawMessage) error {
	var s struct {
		Op string `json:"op"`
		PipeSpec
	}
	if err := decode(op, raw, &s); err != nil {
		return err
	}
	if err := checkCommon(op, s.Argv, s.Cwd, s.Env, s.Metadata); err != nil {
		return err
	}
	if s.OutputPath == "" {
		return invalid(op, "output_path is required")
	}
	out, err := openOutput(op, "output_path", s.OutputPath)
	if err != nil {
		return err
	}
	var errf_ *os.File
	if s.StderrPath != "" {
		if errf_, err = openOutput(op, "stderr_path", s.StderrPath); err != nil {
			out.Close()
			return err
		}
	}
	p := &proc{id: "p-" + randHex(8), mode: ModePipe, argv: s.Argv, cwd: s.Cwd, metadata: s.Metadata, limits: s.Limits,
		exited: make(chan struct{}), ended: make(chan struct{}), done: make(chan struct{}),
		pipe: &pipeState{outPath: s.OutputPath, errPath: s.StderrPath, out: out, errf: errf_}}
	if err := d.startProc(p, func(ctx context.Context) (*custody.Scope, error) {
		return d.cust.StartWith(ctx, command(s.Argv, s.Cwd, s.Env), custody.StartOptions{Limits: limitsOf(s.Limits), Combined: s.StderrPath == ""})
	}); err != nil {
		out.Close()
		if errf_ != nil {
			errf_.Close()
		}
		return err
	}
	d.wg.Add(1)
	go d.runPipe(p, out, errf_)
	d.mu.Lock()
	info := d.info(p)
	d.mu.Unlock()
	return c.send(Reply{Type: TypeProcess, Process: &info})
}

// startProc starts p's command and registers it, unless the daemon is
// shutting down.
func (d *daemon) startProc(p *proc, start func(context.Context) (*custody.Scope, error)) error {
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		return errf(codeShutdown, "daemon shutting down")
	}
	d.wg.Add(1) // held while starting, so shutdown cannot miss this one
	d.mu.Unlock()
	defer d.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	scope, err := start(ctx)
	if err != nil {
		return errf(codeFailed, "start: %v", errors.Unwrap(err))
	}
	p.scope, p.startedAt = scope, time.Now().UTC()
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		rctx, rcancel := context.WithTimeout(context.Background(), DefaultTerminate)
		defer rcancel()
		_, _ = scope.Close(rctx)
		return errf(codeShutdown, "daemon shutting down")
	}
	p.touched = time.Now()
	d.seq++
	p.seq = d.seq
	d.procs[p.id] = p
	d.mu.Unlock()
	return nil
}

// runPipe copies stdout (and stderr) into the files, then publishes the
// exit once the files are closed.
func (d *daemon) runPipe(p *proc, out, errFile *os.File) {
	defer d.wg.Done()
	defer close(p.done)
	var outMu sync.Mutex // stdout and stderr share out when errFile is nil
	var wg sync.WaitGroup
	copyTo := func(r io.Reader, f *os.File, count bool, fmu *sync.Mutex) {
		defer wg.Done()
		buf := make([]byte, 256<<10)
		for {
			n, rerr := r.Read(buf)
			if n > 0 {
				fmu.Lock()
				wn, werr := f.Write(buf[:n])
				fmu.Unlock()
				ps := p.pipe
				ps.mu.Lock()
				if werr != nil && ps.outErr == "" {
					ps.outErr = werr.Error()
				}
				// Only what reached the file counts; the rest is drained
				// so the child never blocks.
				if count {
					ps.bytes += int64(wn)
					ps.lines += int64(bytes.Count(buf[:wn], []byte{'\n'}))
				} else {
					ps.errBytes += int64(wn)
				}
				ps.mu.Unlock()
			}
			if rerr != nil {
				return
			}
		}
	}
	wg.Add(1)
	go copyTo(p.scope.Stdout(), out, true, &outMu)
	if errFile != nil {
		var errMu sync.Mutex
		wg.Add(1)
		go copyTo(p.scope.Stderr(), errFile, false, &errMu)
	}
	readersDone := make(chan struct{})
	go func() { wg.Wait(); close(readersDone) }()
	d.awaitOutput(p, readersDone, p.scope.CloseOutput)
	p.pipe.mu.Lock()
	p.pipe.out, p.pipe.errf = nil, nil // trim is done with them
	p.pipe.mu.Unlock()
	for _, f := range []*os.File{out, errFile} {
		if f == nil {
			continue
		}
		if err := f.Close(); err != nil {
			p.pipe.mu.Lock()
			if p.pipe.outErr == "" {
				p.pipe.outErr = err.Error()
			}
			p.pipe.mu.Unlock()
		}
	}
	p.pipe.mu.Lock()
	lines, n, oe := p.pipe.lines, p.pipe.bytes, p.pipe.outErr
	p.pipe.mu.Unlock()
	d.publishExit(p, lines, oe, n)
}

// awaitOutput waits for the leader's exit and then the output's end (EOF),
// at most ExitDrain after the exit; past that the host's ends are closed,
// so a descendant that holds the pipe cannot hold the exit back. A
// terminated record stops waiting at once.
func (d *daemon) awaitOutput(p *proc, readersDone <-chan struct{}, release func()) {
	select {
	case <-p.scope.Exited():
	case <-p.ended:
	}
	t := time.NewTimer(d.opts.ExitDrain)
	defer t.Stop()
	select {
	case <-readersDone:
		return
	case <-t.C:
	case <-p.ended:
	}
	release()
	<-readersDone
}

// publishExit records how the leader ended; waiters wake.
func (d *daemon) publishExit(p *proc, lines int64, outErr string, final int64) {
	<-p.scope.Exited() // the leader is reaped (a terminated scope is closed)
	e := &Exit{ID: p.id, ExitedAt: time.Now().UTC(), OutputLines: lines, OutputError: outErr, FinalOffset: final}
	var ee *exec.ExitError
	if err := p.scope.ExitErr(); errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Code, e.Signal = 128+int(ws.Signal()), strings.TrimPrefix(unix.SignalName(ws.Signal()), "SIG")
		} else {
			e.Code = ee.ExitCode()
		}
	} else if err != nil {
		e.Code = -1
	}
	d.mu.Lock()
	p.exit = e
	d.mu.Unlock()
	close(p.exited)
}

func (d *daemon) opWrite(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op   string `json:"op"`
		ID   string `json:"id"`
		Data []byte `json:"data"`
		EOF  bool   `json:"eof"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	if len(r.Data) > maxWrite {
		return invalid(op, "data is %d bytes, over %d", len(r.Data), maxWrite)
	}
	p, err := d.lookup(op, r.ID)
	if err != nil {
		return err
	}
	if p.pty != nil {
		if r.EOF {
			return invalid(op, "eof applies to pipe processes")
		}
		if err := p.pty.write(nil, r.Data); err != nil {
			return err
		}
		return c.send(Reply{Type: TypeOK})
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	in := p.scope.Stdin()
	if f, ok := in.(interface{ SetWriteDeadline(time.Time) error }); ok {
		_ = f.SetWriteDeadline(time.Now().Add(writeTimeout))
	}
	if len(r.Data) > 0 {
		if _, err := in.Write(r.Data); err != nil {
			return errf(codeFailed, "write: stdin: %v", errors.Unwrap(err))
		}
	}
	if r.EOF {
		_ = in.Close()
	}
	return c.send(Reply{Type: TypeOK})
}

// encodedSize bounds a ProcessInfo's JSON from above without encoding it:
// the metadata as it is (already JSON), every string at its worst
// escaping (6 bytes a byte), and the fixed fields.
func encodedSize(pi ProcessInfo) int {
	n := len(pi.ID) + len(pi.Cwd)
	for _, a := range pi.Argv {
		n += len(a) + 3
	}
	if pi.Pipe != nil {
		n += len(pi.Pipe.OutputPath) + len(pi.Pipe.StderrPath) + len(pi.Pipe.OutputError)
	}
	if pi.Exit != nil {
		n += len(pi.Exit.OutputError) + len(pi.Exit.Signal)
	}
	return len(pi.Metadata) + 6*n + 1024
}

// listPageBytes bounds the processes one list reply carries (each may hold
// MaxMetadata): a page ends before it, and the reply's Next asks for the
// rest, so a list never outgrows a frame.
const listPageBytes = MaxFrame / 2

func (d *daemon) opList(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op    string `json:"op"`
		Mode  Mode   `json:"mode"`
		After string `json:"after"`
		Limit int    `json:"limit"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	if r.Mode != ModePipe && r.Mode != ModePTY {
		return invalid(op, "mode must be %q or %q", ModePTY, ModePipe)
	}
	var after uint64
	if r.After != "" {
		n, err := strconv.ParseUint(r.After, 10, 64)
		if err != nil {
			return invalid(op, "after must be a list reply's next")
		}
		after = n
	}
	if r.Limit < 0 {
		return invalid(op, "limit must not be negative")
	}
	d.mu.Lock()
	var ps []*proc
	for _, p := range d.procs {
		if p.mode == r.Mode && p.seq > after {
			ps = append(ps, p)
		}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].seq < ps[j].seq })
	out := []ProcessInfo{}
	size, next := 0, ""
	for i, p := range ps {
		info := d.info(p)
		n := encodedSize(info)
		if len(out) > 0 && (size+n > listPageBytes || (r.Limit > 0 && len(out) == r.Limit)) {
			next = strconv.FormatUint(ps[i-1].seq, 10)
			break
		}
		size += n
		out = append(out, info)
	}
	d.mu.Unlock()
	return c.send(Reply{Type: TypeProcesses, Processes: out, Next: next})
}

func (d *daemon) opGet(c *conn, op string, raw json.RawMessage) error {
	p, err := d.lookupRequest(op, raw)
	if err != nil {
		return err
	}
	d.mu.Lock()
	info := d.info(p)
	d.mu.Unlock()
	return c.send(Reply{Type: TypeProcess, Process: &info})
}

func (d *daemon) opWait(c *conn, op string, raw json.RawMessage) error {
	p, err := d.lookupRequest(op, raw)
	if err != nil {
		return err
	}
	d.mu.Lock()
	p.watchers++
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		p.watchers--
		p.touched = time.Now()
		d.mu.Unlock()
	}()
	gone := watchClose(c, &d.wg)
	select {
	case <-p.exited:
	case <-p.ended:
	case <-gone:
		return nil // the client left; nothing to say
	}
	d.mu.Lock()
	e, code := p.exit, p.endCode
	d.mu.Unlock()
	// An exit published before the record was ended stands; otherwise
	// the end is the answer.
	if code != "" && !p.exitBeforeEnd {
		if code == codeShutdown {
			return errf(codeShutdown, "daemon shutting down")
		}
		return errf(codeTerminated, "terminated")
	}
	return c.send(Reply{Type: TypeExited, Exit: e})
}

func (d *daemon) opSignal(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op     string `json:"op"`
		ID     string `json:"id"`
		Signal Signal `json:"signal"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	var sig syscall.Signal
	switch strings.TrimPrefix(strings.ToUpper(string(r.Signal)), "SIG") {
	case "TERM":
		sig = syscall.SIGTERM
	case "INT":
		sig = syscall.SIGINT
	case "KILL":
		sig = syscall.SIGKILL
	default:
		return invalid(op, "signal must be TERM, INT or KILL")
	}
	p, err := d.lookup(op, r.ID)
	if err != nil {
		return err
	}
	if err := p.scope.Signal(sig); err != nil {
		// The scope closed between lookup and here: the record is gone.
		return errf(codeNotFound, "no such process: %s", r.ID)
	}
	return c.send(Reply{Type: TypeOK})
}

func (d *daemon) opSetMetadata(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op       string          `json:"op"`
		ID       string          `json:"id"`
		Metadata json.RawMessage `json:"metadata"`
	}
	if len(raw) > MaxMetadata+(64<<10) {
		return invalid(op, "metadata is over %d bytes", MaxMetadata)
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	if len(r.Metadata) > MaxMetadata {
		return invalid(op, "metadata is %d bytes, over %d", len(r.Metadata), MaxMetadata)
	}
	p, err := d.lookup(op, r.ID)
	if err != nil {
		return err
	}
	d.mu.Lock()
	p.metadata = r.Metadata
	d.mu.Unlock()
	return c.send(Reply{Type: TypeOK})
}

func (d *daemon) opTerminate(c *conn, op string, raw json.RawMessage) error {
	p, err := d.lookupRequest(op, raw)
	if err != nil {
		return err
	}
	rec, err := d.terminate(p, codeTerminated)
	if err != nil {
		return err
	}
	return c.send(Reply{Type: TypeTerminated, Receipt: rec})
}

// terminate removes p's record (so no later signal can reach a reused pid),
// wakes its waiters, and closes its scope: the whole tree, with a receipt.
// Concurrent calls for one record: the first does it, the rest get
// ErrNotFound.
func (d *daemon) terminate(p *proc, code string) (*custody.Receipt, error) {
	d.mu.Lock()
	if d.procs[p.id] != p || p.endCode != "" {
		d.mu.Unlock()
		return nil, errf(codeNotFound, "no such process: %s", p.id)
	}
	delete(d.procs, p.id)
	p.endCode = code
	p.exitBeforeEnd = p.exit != nil
	if len(d.procs) == 0 {
		d.idleFrom = time.Now()
	}
	d.mu.Unlock()
	close(p.ended)
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTerminate)
	defer cancel()
	r, err := p.scope.Close(ctx)
	if err != nil {
		return nil, errf(codeFailed, "terminate: %v", err)
	}
	<-p.done
	return r, nil
}

// trimAlign: trim punches whole pages only, so a part of a page is never
// zeroed again and again.
const trimAlign = 4 << 10

func (d *daemon) opTrim(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op     string `json:"op"`
		ID     string `json:"id"`
		Output int64  `json:"output"`
		Stderr int64  `json:"stderr"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	if r.Output < 0 || r.Stderr < 0 {
		return invalid(op, "offsets must not be negative")
	}
	p, err := d.lookup(op, r.ID)
	if err != nil {
		return err
	}
	ps := p.pipe
	if ps == nil {
		return invalid(op, "%s is not a pipe process", r.ID)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	// Never past what reached the file; nothing once the files are closed
	// (the process ended: its files go with its record).
	if err := punch(ps.out, &ps.outTrimmed, min(r.Output, ps.bytes)); err != nil {
		return errf(codeFailed, "trim: %s: %v", filepath.Base(ps.outPath), err)
	}
	if err := punch(ps.errf, &ps.errTrimmed, min(r.Stderr, ps.errBytes)); err != nil {
		return errf(codeFailed, "trim: %s: %v", filepath.Base(ps.errPath), err)
	}
	return c.send(Reply{Type: TypeOK})
}

// limitsOf is a request's limits (nil: none).
func limitsOf(l *custody.Limits) custody.Limits {
	if l == nil {
		return custody.Limits{}
	}
	return *l
}

// opUsage answers what a process's scope has used (custody's Usage),
// resetting its peak memory after the read when asked (protocol 10).
func (d *daemon) opUsage(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op        string `json:"op"`
		ID        string `json:"id"`
		ResetPeak bool   `json:"reset_peak,omitempty"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	p, err := d.lookup(op, r.ID)
	if err != nil {
		return err
	}
	u := p.scope.Usage()
	if r.ResetPeak {
		if err := p.scope.ResetPeak(); err != nil {
			return errf(codeFailed, "usage: %v", err)
		}
	}
	return c.send(Reply{Type: TypeUsage, Usage: &u})
}
