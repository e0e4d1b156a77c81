package daemonproc

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/procd"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// daemon runs a procd daemon in this process for dir and returns its
// owner client; both end with the test.
func daemon(t *testing.T) (*procd.Client, string) {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- procd.Run(ctx, procd.Options{DataDir: dir}) }()
	var c *procd.Client
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		c, err = procd.Dial(cctx, dir)
		ccancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("the daemon does not answer: %v", err)
		}
		select {
		case err := <-ran:
			cancel()
			t.Fatalf("the daemon ended: %v", err)
		case <-time.After(10 * time.Millisecond): // its registration is a file: polled, bounded
		}
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-ran:
		case <-time.After(60 * time.Second):
			t.Error("the daemon did not end")
		}
	})
	return c, dir
}

// runner is a Runner over c, closed with the test.
func runner(t *testing.T, c *procd.Client) *Runner {
	t.Helper()
	r, err := NewRunner(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// echo starts a line echoer as a pipe process of the daemon.
func echo(t *testing.T, r *Runner, dir string) *Process {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `while read l; do echo "got:$l"; done`)
	cmd.Dir = dir
	p, err := (&Starter{Runner: r, Dir: filepath.Join(dir, "out")}).Start(ctxT(t), cmd)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Process)
}

// readLine reads one line from r within the test's deadline.
func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := r.ReadString('\n')
		ch <- res{s, err}
	}()
	select {
	case x := <-ch:
		if x.err != nil {
			t.Fatalf("read: %v", x.err)
		}
		return x.s
	case <-time.After(30 * time.Second):
		t.Fatal("no line")
	}
	return ""
}

// Stdin through write, stdout tailed from the output file; let go of
// (Detach) the process runs on, and another Process attaches at an offset
// and reads on from exactly there; Stop terminates the tree with a receipt
// and removes the files.
func TestProcess_DetachAttachStop(t *testing.T) {
	c, dir := daemon(t)
	r := runner(t, c)
	p := echo(t, r, dir)
	h := p.Handle()
	out := bufio.NewReader(p.Stdout())
	if _, err := p.Stdin().Write([]byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if got := readLine(t, out); got != "got:one\n" {
		t.Fatalf("line %q", got)
	}
	offset := int64(len("got:one\n"))
	p.Detach()
	// Let go of: Stop and Close reach nothing.
	if err := p.Stdin().Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctxT(t), h.ID, []byte("two\n")); err != nil {
		t.Fatalf("the process did not outlive Detach: %v", err)
	}
	parsed, err := ParseHandle(h.String())
	if err != nil || parsed != h {
		t.Fatalf("handle round trip: %+v %v", parsed, err)
	}
	// A handle of another daemon instance (a fresh daemon reuses ids)
	// never attaches.
	other := parsed
	other.Instance = "0123456789abcdef"
	if _, err := r.Attach(ctxT(t), other, offset); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("attach with another instance's handle: %v", err)
	}
	q, err := r.Attach(ctxT(t), parsed, offset)
	if err != nil {
		t.Fatal(err)
	}
	out = bufio.NewReader(q.Stdout())
	if got := readLine(t, out); got != "got:two\n" {
		t.Fatalf("after attach, line %q (want the one after the offset)", got)
	}
	if _, err := q.Stdin().Write([]byte("three\n")); err != nil {
		t.Fatal(err)
	}
	if got := readLine(t, out); got != "got:three\n" {
		t.Fatalf("line %q", got)
	}
	if err := q.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if q.Receipt() == nil || len(q.Receipt().Processes) == 0 {
		t.Fatalf("no receipt: %+v", q.Receipt())
	}
	select {
	case <-q.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("Exited not closed after Stop")
	}
	if _, err := os.Stat(h.Output); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the output file is left: %v", err)
	}
	if _, err := r.Attach(ctxT(t), h, 0); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("attach to a terminated process: %v", err)
	}
	q.CloseOutput()
}

// The reader ends at the process's exit with everything it wrote, and the
// exit status is reported.
func TestProcess_ExitEndsTheReader(t *testing.T) {
	c, dir := daemon(t)
	cmd := exec.Command("/bin/sh", "-c", `echo a; echo b; exit 3`)
	cmd.Dir = dir
	rp, err := (&Starter{Runner: runner(t, c), Dir: filepath.Join(dir, "out")}).Start(ctxT(t), cmd)
	if err != nil {
		t.Fatal(err)
	}
	p := rp.(*Process)
	done := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(p.Stdout())
		done <- b
	}()
	select {
	case b := <-done:
		if string(b) != "a\nb\n" {
			t.Fatalf("output %q", b)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reader did not end at the exit")
	}
	if err := p.ExitErr(); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("exit error %v", err)
	}
	if err := p.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	p.CloseOutput()
}
