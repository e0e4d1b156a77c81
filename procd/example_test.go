//go:build linux

package procd_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/agenthost/agenthost/procd"
)

// A planned restart: the host owns the data dir's daemon, starts a
// process through it, prepares a handoff and exits; the next host claims
// the daemon with the ticket and finds the process still running.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "procd-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// In a host the daemon is agenthost's own "procd" command (the
	// default); here the test binary plays it.
	opts := &procd.ClientOptions{DaemonCommand: []string{os.Args[0]}, DaemonEnv: append(os.Environ(), "PROCD_TEST_DAEMON=1")}

	old, err := procd.Own(ctx, dir, opts)
	if err != nil {
		log.Fatal(err)
	}
	p, err := old.CreatePipe(ctx, procd.PipeSpec{Argv: []string{"sleep", "300"}, Cwd: dir,
		Env: []string{"PATH=" + os.Getenv("PATH")}, OutputPath: filepath.Join(dir, "sleep.out")})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := old.PrepareHandoff(ctx); err != nil {
		log.Fatal(err)
	}
	_ = old.Close() // the old host exits

	next, err := procd.Own(ctx, dir, opts)
	if err != nil {
		log.Fatal(err)
	}
	defer next.Close()
	info, err := next.Get(ctx, p.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("claimed:", next.Claimed())
	fmt.Println("same process, running:", info.PID == p.PID && info.Running)

	// Shutdown ends every process, each with its custody receipt.
	receipts, err := next.Shutdown(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("receipts:", len(receipts))
	// Output:
	// claimed: true
	// same process, running: true
	// receipts: 1
}
