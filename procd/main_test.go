//go:build linux

package procd

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"go.uber.org/goleak"
)

// The test binary plays the daemon (and its detaching starter) when
// PROCD_TEST_DAEMON is set: the real daemon code in its own process, as
// agenthost procd runs it.
const daemonEnv = "PROCD_TEST_DAEMON"

func TestMain(m *testing.M) {
	if os.Getenv(daemonEnv) != "" {
		os.Exit(daemonMain(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

func daemonMain(args []string) int {
	fs := flag.NewFlagSet("procd", flag.ContinueOnError)
	data := fs.String("data", "", "")
	detach := fs.Bool("detach", false, "")
	unattended := fs.Duration("unattended", 0, "")
	idle := fs.Duration("idle", 0, "")
	ttl := fs.Duration("handoff-ttl", 0, "")
	fsize := fs.Int64("fsize", 0, "")
	nofile := fs.Uint64("nofile", 0, "")
	// A daemon of another build: the protocol versions it speaks
	// ("9-10"), and whether it predates negotiation (protocol 8 alone).
	protocols := fs.String("protocols", "", "")
	preNegotiation := fs.Bool("pre-negotiation", false, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var wire wireVersions
	if *protocols != "" {
		if _, err := fmt.Sscanf(*protocols, "%d-%d", &wire.Min, &wire.Max); err != nil {
			fmt.Fprintln(os.Stderr, "--protocols:", err)
			return 2
		}
	}
	if *preNegotiation {
		wire = wireVersions{Range: Range{8, 8}, preNegotiation: true}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *detach {
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		argv := []string{os.Args[0]}
		if *unattended > 0 {
			argv = append(argv, "--unattended", unattended.String())
		}
		if *idle > 0 {
			argv = append(argv, "--idle", idle.String())
		}
		if *ttl > 0 {
			argv = append(argv, "--handoff-ttl", ttl.String())
		}
		if *fsize > 0 {
			argv = append(argv, "--fsize", fmt.Sprint(*fsize))
		}
		if *nofile > 0 {
			argv = append(argv, "--nofile", fmt.Sprint(*nofile))
		}
		if *protocols != "" {
			argv = append(argv, "--protocols", *protocols)
		}
		if *preNegotiation {
			argv = append(argv, "--pre-negotiation")
		}
		if err := Detach(dctx, *data, argv, os.Environ()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}
	if *fsize > 0 {
		// A file size limit makes output writes fail as on a full disk
		// (EFBIG instead of the signal).
		signal.Ignore(syscall.SIGXFSZ)
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: uint64(*fsize), Max: uint64(*fsize)}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if *nofile > 0 {
		// Few descriptors: accepting runs into EMFILE.
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: *nofile, Max: *nofile}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	// As agenthost procd runs it: its scopes may be limited.
	if err := Run(ctx, Options{DataDir: *data, Unattended: *unattended, IdleExit: *idle, HandoffTTL: *ttl, Logger: log, wire: wire,
		Custody: custody.Options{Resources: true}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// testOpts makes clients start the test binary as their daemon; extra
// daemon flags go before --data.
func testOpts(flags ...string) *ClientOptions {
	return &ClientOptions{DaemonCommand: append([]string{os.Args[0]}, flags...), DaemonEnv: append(os.Environ(), daemonEnv+"=1")}
}
