//go:build linux

package procd

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// benchBytes is what one iteration moves.
const benchBytes = 64 << 20

// BenchmarkPipeThroughput compares a process's stdout written to a file
// through the daemon (create_pipe, then wait) with the same command's
// stdout piped straight into a file by this process.
//
//	go test -run '^$' -bench PipeThroughput -benchtime 10x ./procd
func BenchmarkPipeThroughput(b *testing.B) {
	argv := []string{"head", "-c", strconv.Itoa(benchBytes), "/dev/zero"}
	b.Run("daemon", func(b *testing.B) {
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
		b.SetBytes(benchBytes)
		b.ResetTimer()
		for range b.N {
			info, err := c.CreatePipe(ctx, PipeSpec{Argv: argv, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}, OutputPath: out})
			if err != nil {
				b.Fatal(err)
			}
			e, err := c.Wait(ctx, info.ID)
			if err != nil || e.FinalOffset != benchBytes {
				b.Fatalf("%+v %v", e, err)
			}
			b.StopTimer()
			if _, err := c.Terminate(ctx, info.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("direct", func(b *testing.B) {
		out := filepath.Join(b.TempDir(), "out")
		b.SetBytes(benchBytes)
		for range b.N {
			f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			cmd := exec.Command(argv[0], argv[1:]...)
			r, err := cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 256<<10)
			n, err := io.CopyBuffer(struct{ io.Writer }{f}, r, buf)
			if err != nil || n != benchBytes {
				b.Fatal(n, err)
			}
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
}
