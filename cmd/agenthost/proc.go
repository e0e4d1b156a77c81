package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/procd"
)

// procDaemonEnv, when set, is the environment the proc commands start a
// daemon with (tests make the test binary run agenthost with it).
var procDaemonEnv []string

// newProcdCmd is the daemon itself, in the foreground.
func newProcdCmd(verbose func() bool) *cobra.Command {
	var f struct {
		data             string
		detach           bool
		unattended, idle time.Duration
	}
	cmd := &cobra.Command{
		Use:   "procd [--data DIR]",
		Short: "Run the process daemon of a data dir in the foreground",
		Long: `Run the process daemon of a data dir in the foreground until it is shut down.

The daemon starts and reaps processes for agenthost serve --daemon and agenthost
proc, so they outlive a restart of the server. The proc commands and the server
start it on demand; one runs per data dir.

It is not a service to keep running: with no owner (agenthost serve --daemon),
no process and no client it exits 0 after 5s (--idle-exit). A process that
exited keeps its record, and the daemon alive, until proc kill removes it or
nobody has asked about it for the --unattended time.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := procData(f.data)
			if err != nil {
				return err
			}
			if f.detach {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				argv := []string{exe, "procd"}
				if f.unattended > 0 {
					argv = append(argv, "--unattended", f.unattended.String())
				}
				if f.idle > 0 {
					argv = append(argv, "--idle-exit", f.idle.String())
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), procd.DefaultStartTimeout)
				defer cancel()
				return procd.Detach(ctx, data, argv, os.Environ())
			}
			// The daemon always logs (to its log file when detached).
			level := slog.LevelInfo
			if verbose() {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			// A hangup (the terminal of a foreground daemon closing) ends
			// it like SIGTERM: everything stopped, with receipts.
			ctx := cmd.Context()
			if len(hangup) > 0 { // none given would mean every signal
				var stop context.CancelFunc
				ctx, stop = signal.NotifyContext(ctx, hangup...)
				defer stop()
			}
			idle := f.idle
			if idle <= 0 {
				idle = procd.DefaultIdleExit
			}
			// Said at start: a daemon that quietly exits looks like a crash to
			// someone who started it in a terminal.
			log.Info("procd: exits when idle: no owner, process or client", "after", idle)
			// Its scopes take the rooms' limits (custody's Resources).
			err = procd.Run(ctx, procd.Options{DataDir: data, Unattended: f.unattended, IdleExit: f.idle, Logger: log,
				Custody: custody.Options{Resources: true, Logger: log}})
			if errors.Is(err, procd.ErrRunning) {
				return &exitError{1, fmt.Errorf("procd: a daemon already runs for %s", data)}
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.data, "data", "", "data dir (default: $AGENTHOST_DATA or a per-user dir)")
	fl.BoolVar(&f.detach, "detach", false, "start the daemon in the background and return once it answers")
	fl.DurationVar(&f.unattended, "unattended", 0, "end a process nobody attends to after this long, without an owner (default 10m)")
	fl.DurationVar(&f.idle, "idle-exit", 0, "exit after this long without owner, process or client (default 5s)")
	return cmd
}

// procData is --data, else AGENTHOST_DATA, else the default data dir; made
// absolute.
func procData(flag string) (string, error) {
	d := flag
	if d == "" {
		d = os.Getenv("AGENTHOST_DATA")
	}
	if d == "" {
		var err error
		if d, err = defaultDataDir(); err != nil {
			return "", &exitError{2, err}
		}
	}
	return filepath.Abs(d)
}

func newProcCmd() *cobra.Command {
	var data string
	cmd := &cobra.Command{
		Use:   "proc",
		Short: "Run and manage processes in the process daemon",
		Long: `Run and manage processes in the data dir's process daemon (started on demand,
except by shutdown). These commands are clients, not the daemon's owner: a
process nobody attends to (no wait, attach or other command naming it) is
ended after the daemon's --unattended bound while no server owns the daemon.`,
	}
	cmd.PersistentFlags().StringVar(&data, "data", "", "data dir (default: $AGENTHOST_DATA or a per-user dir)")
	connect := func(ctx context.Context) (*procd.Client, error) {
		d, err := procData(data)
		if err != nil {
			return nil, err
		}
		return procd.Connect(ctx, d, &procd.ClientOptions{DaemonEnv: procDaemonEnv})
	}

	var run struct {
		pty         bool
		output, cwd string
		meta        string
		cols, rows  uint16
	}
	runCmd := &cobra.Command{
		Use:   "run [--pty] [--output FILE] [--cwd DIR] [--meta JSON] -- COMMAND ARGS...",
		Short: "Start a process in the daemon and print its id",
		Long: `Start COMMAND in the daemon with this shell's environment and print its id.
A pipe process's stdout and stderr go to --output (default: a new file under
DIR/procd/out); a --pty process keeps 2 MiB of replay for attach.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 0 {
				return &exitError{2, errors.New("proc run: the command goes after --")}
			}
			cwd := run.cwd
			if cwd == "" {
				cwd, _ = os.Getwd()
			}
			cwd, err := filepath.Abs(cwd)
			if err != nil {
				return &exitError{2, err}
			}
			var meta json.RawMessage
			if run.meta != "" {
				if !json.Valid([]byte(run.meta)) {
					return &exitError{2, errors.New("proc run: --meta is not JSON")}
				}
				meta = json.RawMessage(run.meta)
			}
			c, err := connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			var info procd.ProcessInfo
			if run.pty {
				if run.output != "" {
					return &exitError{2, errors.New("proc run: --output is for pipe processes")}
				}
				info, err = c.CreatePTY(cmd.Context(), procd.PTYSpec{Argv: args, Cwd: cwd, Env: os.Environ(), Cols: run.cols, Rows: run.rows, Metadata: meta})
			} else {
				out := run.output
				if out == "" {
					d, _ := procData(data)
					dir := filepath.Join(d, "procd", "out")
					if err := os.MkdirAll(dir, 0o700); err != nil {
						return err
					}
					out = filepath.Join(dir, fmt.Sprintf("%d.out", time.Now().UnixNano()))
				}
				if out, err = filepath.Abs(out); err != nil {
					return &exitError{2, err}
				}
				info, err = c.CreatePipe(cmd.Context(), procd.PipeSpec{Argv: args, Cwd: cwd, Env: os.Environ(), OutputPath: out, Metadata: meta})
			}
			if err != nil {
				return usageIfInvalid(err)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), info.ID)
			return err
		},
	}
	rf := runCmd.Flags()
	rf.BoolVar(&run.pty, "pty", false, "run on a pseudo-terminal")
	rf.StringVar(&run.output, "output", "", "the pipe process's output file")
	rf.StringVar(&run.cwd, "cwd", "", "working directory (default: the current one)")
	rf.StringVar(&run.meta, "meta", "", "opaque JSON metadata kept with the process")
	rf.Uint16Var(&run.cols, "cols", 80, "pty columns")
	rf.Uint16Var(&run.rows, "rows", 24, "pty rows")

	var mode string
	listCmd := &cobra.Command{
		Use:   "list [--mode pty|pipe]",
		Short: "List processes (one JSON object a line)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			modes := []procd.Mode{procd.ModePTY, procd.ModePipe}
			switch mode {
			case "":
			case "pty", "pipe":
				modes = []procd.Mode{procd.Mode(mode)}
			default:
				return &exitError{2, fmt.Errorf("proc list: --mode is pty or pipe, not %q", mode)}
			}
			c, err := connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			for _, m := range modes {
				ps, err := c.List(cmd.Context(), m)
				if err != nil {
					return err
				}
				for _, p := range ps {
					if err := printJSON(cmd.OutOrStdout(), p); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
	listCmd.Flags().StringVar(&mode, "mode", "", "pty or pipe (default: both)")

	oneID := func(use, short string, do func(ctx context.Context, c *procd.Client, id string, args []string, out io.Writer) error, nargs int) *cobra.Command {
		return &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.ExactArgs(nargs),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := connect(cmd.Context())
				if err != nil {
					return err
				}
				defer c.Close()
				return usageIfInvalid(do(cmd.Context(), c, args[0], args[1:], cmd.OutOrStdout()))
			},
		}
	}
	getCmd := oneID("get ID", "Print a process's ProcessInfo as JSON", func(ctx context.Context, c *procd.Client, id string, _ []string, out io.Writer) error {
		p, err := c.Get(ctx, id)
		if err != nil {
			return err
		}
		return printJSON(out, p)
	}, 1)
	waitCmd := oneID("wait ID", "Wait for a process to exit; print the exit as JSON and exit with its code", func(ctx context.Context, c *procd.Client, id string, _ []string, out io.Writer) error {
		e, err := c.Wait(ctx, id)
		if err != nil {
			return err
		}
		if err := printJSON(out, e); err != nil {
			return err
		}
		if e.Code != 0 {
			return &exitError{e.Code & 0xff, fmt.Errorf("process %s exited %d", id, e.Code)}
		}
		return nil
	}, 1)
	signalCmd := oneID("signal ID TERM|INT|KILL", "Send a signal to a process's group (the record is kept)", func(ctx context.Context, c *procd.Client, id string, args []string, out io.Writer) error {
		return c.Signal(ctx, id, procd.Signal(strings.ToUpper(args[0])))
	}, 2)
	killCmd := oneID("kill ID", "End a process and everything it started; print the receipt", func(ctx context.Context, c *procd.Client, id string, _ []string, out io.Writer) error {
		r, err := c.Terminate(ctx, id)
		if err != nil {
			return err
		}
		return printJSON(out, r)
	}, 1)
	attachCmd := oneID("attach ID", "Attach this terminal to a pty process, with its replay (detach: Ctrl-])", func(ctx context.Context, c *procd.Client, id string, _ []string, out io.Writer) error {
		return attach(ctx, c, id, os.Stdin, out, os.Stderr)
	}, 1)
	shutdownCmd := &cobra.Command{
		Use:   "shutdown",
		Short: "End the daemon and every process in it; print the receipts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := procData(data)
			if err != nil {
				return err
			}
			c, err := procd.Dial(cmd.Context(), d)
			if errors.Is(err, procd.ErrNoDaemon) {
				fmt.Fprintln(cmd.ErrOrStderr(), "no daemon runs for", d)
				return nil
			} else if err != nil {
				return err
			}
			defer c.Close()
			rs, err := c.Shutdown(cmd.Context())
			if err != nil {
				return err
			}
			for _, r := range rs {
				if err := printJSON(cmd.OutOrStdout(), r); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(runCmd, listCmd, getCmd, waitCmd, signalCmd, killCmd, attachCmd, shutdownCmd)
	return cmd
}

// usageIfInvalid makes a request the daemon refused as invalid a usage
// error (exit 2); an unknown process is the operation failing (exit 1).
func usageIfInvalid(err error) error {
	if errors.Is(err, procd.ErrInvalid) {
		return &exitError{2, err}
	}
	return err
}

// attach puts the terminal in raw mode and relays it to the pty: the
// replay first, then live output; input, and resizes on SIGWINCH, go to
// the process. Ctrl-] detaches. A request the daemon refuses (input or a
// resize) is shown on errOut; the attach goes on.
func attach(ctx context.Context, c *procd.Client, id string, stdin *os.File, out, errOut io.Writer) error {
	s, err := c.Subscribe(ctx, id, 0, true)
	if err != nil {
		return err
	}
	defer s.Close()
	in := int(stdin.Fd())
	if restore, ok := makeRaw(in); ok {
		defer restore()
	}
	if cols, rows, ok := usableSize(in); ok {
		_ = s.Resize(cols, rows)
	}
	if _, err := out.Write(s.Attached.Data); err != nil {
		return err
	}
	winch := make(chan os.Signal, 1)
	notifyResize(winch)
	defer signal.Stop(winch)
	done := make(chan struct{})
	defer close(done)
	// stdin is read by a goroutine that may stay blocked in Read after
	// detaching; the command exits right after, which ends it.
	keys := make(chan []byte)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := stdin.Read(buf)
			if n > 0 {
				select {
				case keys <- append([]byte(nil), buf[:n]...):
				case <-done:
					return
				}
			}
			if err != nil {
				close(keys)
				return
			}
		}
	}()
	events := make(chan procd.Reply)
	evErr := make(chan error, 1)
	go func() {
		for {
			ev, err := s.Next(context.Background())
			var refused *procd.ReplyError
			if errors.As(err, &refused) {
				// A refusal, not the end: shown, and the attach goes on.
				ev, err = procd.Reply{Type: procd.TypeError, Message: refused.Message}, nil
			}
			if err != nil {
				evErr <- err
				return
			}
			select {
			case events <- ev:
			case <-done:
				return
			}
		}
	}()
	for {
		select {
		case k, ok := <-keys:
			if !ok {
				keys = nil
				continue
			}
			if i := strings.IndexByte(string(k), 0x1d); i >= 0 { // Ctrl-]
				if i > 0 {
					_ = s.Input(k[:i])
				}
				return nil
			}
			if err := s.Input(k); err != nil {
				return err
			}
		case <-winch:
			if cols, rows, ok := usableSize(in); ok {
				_ = s.Resize(cols, rows)
			}
		case ev := <-events:
			switch ev.Type {
			case procd.TypeOutput:
				if _, err := out.Write(ev.Data); err != nil {
					return err
				}
			case procd.TypeExited:
				if ev.Exit.Code != 0 {
					return &exitError{ev.Exit.Code & 0xff, fmt.Errorf("process %s exited %d", id, ev.Exit.Code)}
				}
				return nil
			case procd.TypeDropped, procd.TypeControllerChanged:
				return fmt.Errorf("detached: %s", ev.Type)
			case procd.TypeError:
				// The terminal is raw: the line ends with CR LF.
				fmt.Fprintf(errOut, "agenthost: %s\r\n", ev.Message)
			}
		case err := <-evErr:
			return fmt.Errorf("detached: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// usableSize is the terminal's size, unless it reports a zero (a terminal
// that does not know its size, such as a fresh pty): the daemon refuses
// that, and the process keeps the size it has.
func usableSize(fd int) (cols, rows uint16, ok bool) {
	cols, rows, ok = termSize(fd)
	return cols, rows, ok && cols > 0 && rows > 0
}
