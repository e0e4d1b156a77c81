//go:build linux

package procd

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// benchBytes is what one transfer moves.
const benchBytes = 64 << 20

// BenchmarkPipeThroughput compares a process's stdout written to a file
// through the daemon (create_pipe, then wait) with the same command's
// stdout piped straight into a file by this process. Each iteration runs
// both, one after the other, so a loaded machine slows both alike; the
// metrics are each side's MB/s and their ratio. A third arm runs the direct
// pipe with the child in a session of its own, as custody starts it: with
// the scheduler's autogroups (one per session) a loaded machine slows a
// pipe between two sessions, and that arm shows how much of the gap is
// that rather than the daemon.
//
//	go test -run '^$' -bench PipeThroughput -benchtime 10x -count 3 ./procd
func BenchmarkPipeThroughput(b *testing.B) {
	argv := []string{"head", "-c", strconv.Itoa(benchBytes), "/dev/zero"}
	dir := b.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := Connect(ctx, dir, testOpts())
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		_, _ = c.Shutdown(ctx)
		_ = waitGone(ctx, dir)
	}()
	out := filepath.Join(b.TempDir(), "out")
	viaDaemon := func() time.Duration {
		t0 := time.Now()
		info, err := c.CreatePipe(ctx, PipeSpec{Argv: argv, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}, OutputPath: out})
		if err != nil {
			b.Fatal(err)
		}
		e, err := c.Wait(ctx, info.ID)
		if err != nil || e.FinalOffset != benchBytes {
			b.Fatalf("%+v %v", e, err)
		}
		d := time.Since(t0)
		if _, err := c.Terminate(ctx, info.ID); err != nil {
			b.Fatal(err)
		}
		return d
	}
	direct := func(setsid bool) time.Duration {
		t0 := time.Now()
		f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		cmd := exec.Command(argv[0], argv[1:]...)
		if setsid {
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		}
		r, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(struct{ io.Writer }{f}, r, make([]byte, 256<<10))
		if err != nil || n != benchBytes {
			b.Fatal(n, err)
		}
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	var td, tp, ts time.Duration
	b.SetBytes(3 * benchBytes)
	b.ResetTimer()
	for i := range b.N {
		// Rotating which goes first evens out warm caches.
		for j := range 3 {
			switch (i + j) % 3 {
			case 0:
				td += viaDaemon()
			case 1:
				tp += direct(false)
			case 2:
				ts += direct(true)
			}
		}
	}
	mbps := func(d time.Duration) float64 { return float64(b.N) * benchBytes / 1e6 / d.Seconds() }
	b.ReportMetric(mbps(td), "daemon-MB/s")
	b.ReportMetric(mbps(tp), "direct-MB/s")
	b.ReportMetric(mbps(ts), "direct-own-session-MB/s")
	b.ReportMetric(100*tp.Seconds()/td.Seconds(), "daemon/direct-%")
}
