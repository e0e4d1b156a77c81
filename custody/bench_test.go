//go:build linux

package custody

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// BenchmarkClose_AgentExitsOnEOF: Close → receipt for a command that exits
// on stdin EOF. Reports how long after the command's own exit the receipt
// was ready (target: within 50 ms).
func BenchmarkClose_AgentExitsOnEOF(b *testing.B) {
	c, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var after time.Duration
	for i := 0; i < b.N; i++ {
		s, err := c.Start(context.Background(), exec.Command("/bin/cat"))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
		after += time.Since(s.exitedAt)
	}
	b.ReportMetric(float64(after.Microseconds())/float64(b.N)/1000, "ms-after-exit/op")
}

// BenchmarkClose_50EscapedIgnoringTerm: 50 setsid'd descendants that ignore
// SIGTERM. Reports the time beyond the grace periods actually waited
// (target: the two graces plus at most 100 ms).
func BenchmarkClose_50EscapedIgnoringTerm(b *testing.B) {
	const grace = time.Second
	c, err := New(Options{Grace: grace, TermGrace: grace})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	script := `trap "" TERM; i=0; while [ $i -lt 50 ]; do setsid /bin/sleep 3100 & i=$((i+1)); done; echo ready; exec cat`
	var total time.Duration
	for i := 0; i < b.N; i++ {
		s, err := c.Start(context.Background(), exec.Command("/bin/sh", "-c", script))
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 6)
		if _, err := s.Stdout().Read(buf); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		r, err := s.Close(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
		if len(r.Processes) < 51 {
			b.Fatalf("receipt has %d processes", len(r.Processes))
		}
	}
	avg := total / time.Duration(b.N)
	b.ReportMetric(float64(avg.Milliseconds()), "ms-close/op")
	// The leader exits on EOF at once, so only the TERM grace is waited.
	b.ReportMetric(float64((avg - grace).Milliseconds()), "ms-over-graces-waited/op")
}

// BenchmarkTrack100Scopes: CPU the host spends tracking 100 open scopes,
// as a percentage of one core, over AGENTHOST_TRACK_FOR (default 10s; the
// issue's figure uses 1m).
func BenchmarkTrack100Scopes(b *testing.B) {
	d := 10 * time.Second
	if v := os.Getenv("AGENTHOST_TRACK_FOR"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			b.Fatal(err)
		}
	}
	c, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var scopes []*Scope
	for i := 0; i < 100; i++ {
		s, err := c.Start(context.Background(), exec.Command("/bin/cat"))
		if err != nil {
			b.Fatal(err)
		}
		scopes = append(scopes, s)
	}
	b.ResetTimer()
	var before, after syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	t0 := time.Now()
	time.Sleep(d) // the measurement window: custody works in the background
	wall := time.Since(t0)
	syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	b.StopTimer()
	cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "%core")
	fmt.Fprintf(os.Stderr, "tracking 100 scopes for %v used %v CPU (%.2f%% of one core)\n", wall.Round(time.Millisecond), cpu.Round(time.Millisecond), 100*cpu.Seconds()/wall.Seconds())
	for _, s := range scopes {
		if _, err := s.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClose_CPUWhileWaiting: CPU the host spends in a Close that waits
// out TermGrace for 50 descendants ignoring SIGTERM, with about 370
// processes on the machine (300 unrelated ones are started for it), as a
// percentage of one core over the Close.
func BenchmarkClose_CPUWhileWaiting(b *testing.B) {
	var bystanders []*exec.Cmd
	for i := 0; i < 300; i++ {
		cmd := exec.Command("/bin/sleep", "3200")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		bystanders = append(bystanders, cmd)
	}
	defer func() {
		for _, cmd := range bystanders {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	c, err := New(Options{TermGrace: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	script := `trap "" TERM; i=0; while [ $i -lt 50 ]; do setsid /bin/sleep 3201 & i=$((i+1)); done; echo ready; exec cat`
	var cpu, wall time.Duration
	for i := 0; i < b.N; i++ {
		s, err := c.Start(context.Background(), exec.Command("/bin/sh", "-c", script))
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 6)
		if _, err := s.Stdout().Read(buf); err != nil {
			b.Fatal(err)
		}
		var before, after syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &before)
		t0 := time.Now()
		if _, err := s.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
		wall += time.Since(t0)
		syscall.Getrusage(syscall.RUSAGE_SELF, &after)
		cpu += time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	}
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "%core-in-close")
}

// BenchmarkTable: one read of the process table (the cost of every scan).
func BenchmarkTable(b *testing.B) {
	p := newLinuxPlatform()
	for i := 0; i < b.N; i++ {
		if p.table() == nil {
			b.Fatal("no table")
		}
	}
}
