// Command agenthost hosts coding agents (omp, pi, and ACP agents) headless:
// it starts them, talks their native protocol, and leaves no process behind.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/agenthost/agenthost/internal/confine"
)

func main() {
	// A confined agent's launcher: agenthost re-executed to restrict
	// itself, then execute the agent (it never returns).
	confine.Launch()
	os.Exit(mainRun(os.Args[1:], os.Stdout, os.Stderr))
}

// mainRun runs the command line as the process: SIGINT and SIGTERM end
// the command's context (a second one ends the process at once), and the
// result becomes the exit code, its error one line on stderr.
func mainRun(args []string, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case s := <-sigs:
			signal.Stop(sigs) // the next one has its default effect
			cancel(&interrupted{s})
		case <-done:
		}
	}()
	err := run(ctx, args, stdout, stderr)
	close(done)
	<-stopped
	signal.Stop(sigs)
	code, msg := exitStatus(ctx, err)
	if msg != "" {
		fmt.Fprintln(stderr, "agenthost:", msg)
	}
	return code
}
