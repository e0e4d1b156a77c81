package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/agenthost/agenthost/internal/buildinfo"
	"github.com/spf13/cobra"
)

func newRoot() *cobra.Command {
	var verbose bool
	root := &cobra.Command{
		Use:   "agenthost",
		Short: "Host coding agents headless (omp, pi, and ACP agents), and leave no process behind",
		Long: `Host coding agents headless (omp, pi, and ACP agents), and leave no process behind.

Exit codes, the same for every command: 0 success, 1 the operation failed (a
failed turn, not found, the server refused), 2 usage (a flag, argument or
command is wrong), 3 timed out, 130 interrupted (Ctrl-C; 143 on SIGTERM).
An error is one line on stderr.`,
		Version:       buildinfo.Version(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("agenthost {{.Version}}\n")
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "log diagnostics to stderr")
	logger := func() *slog.Logger {
		if !verbose {
			return slog.New(slog.DiscardHandler)
		}
		return slog.New(slog.NewTextHandler(root.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	isVerbose := func() bool { return verbose }
	root.AddCommand(newPromptCmd(logger, isVerbose), newDoctorCmd(logger), newBenchCmd(), newReapCmd(), newServeCmd(isVerbose),
		newRoomsCmd(), newSendCmd(), newEventsCmd(), newApproveCmd(), newAnswerCmd(), newCancelCmd(), newReleaseCmd(), newTokenCmd(), newDiffCmd(), newRevertCmd(), newConfigCmd(),
		newProcdCmd(isVerbose), newProcCmd(), newModelCmd(), newFuseCmd(), newVersionCmd())
	return root
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print agenthost's version: its module version and VCS revision",
		Long: `Print agenthost's version (the same as --version, /healthz and the OpenAPI
document's info.version), then the module version, VCS revision and Go
toolchain it was built from.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in := buildinfo.Read()
			w := cmd.OutOrStdout()
			if asJSON {
				return printJSON(w, in)
			}
			fmt.Fprintf(w, "agenthost %s\n", in.Version)
			fmt.Fprintf(w, "module    %s\n", in.Module)
			if in.Revision != "" {
				mod := ""
				if in.Modified {
					mod = " (modified)"
				}
				fmt.Fprintf(w, "revision  %s%s %s\n", in.Revision, mod, in.Time)
			}
			fmt.Fprintf(w, "go        %s %s\n", in.Go, in.Platform)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print it as one JSON object")
	return cmd
}

// run runs the command line. Every error cobra finds before a command runs
// (an unknown command, flag or subcommand, a wrong number of arguments, a
// bad flag value) is a usage error (exit 2) naming the command.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRoot()
	stopProfile := addCPUProfile(root)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	ran := false
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.RunE == nil && c.Run == nil && c.HasSubCommands() && c.HasParent() {
			// A group: help without arguments, an error for an unknown
			// subcommand (cobra checks those for the root only).
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(cmd *cobra.Command, args []string) error {
				if len(args) > 0 {
					return usageErr(fmt.Errorf("unknown command %q for %q (see %s --help)", args[0], cmd.CommandPath(), cmd.CommandPath()))
				}
				return cmd.Help()
			}
		}
		if f := c.RunE; f != nil {
			c.RunE = func(cmd *cobra.Command, args []string) error {
				ran = true
				return f(cmd, args)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	cmd, err := root.ExecuteContextC(ctx)
	if perr := stopProfile(); perr != nil && err == nil {
		err = fmt.Errorf("--cpuprofile: %w", perr)
	}
	var ee *exitError
	if err != nil && !ran && !errors.As(err, &ee) {
		if cmd.HasParent() {
			err = fmt.Errorf("%s: %w", strings.TrimPrefix(cmd.CommandPath(), root.Name()+" "), err)
		}
		return usageErr(fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath()))
	}
	return err
}
