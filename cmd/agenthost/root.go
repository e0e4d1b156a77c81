package main

import (
	"log/slog"

	"github.com/spf13/cobra"
)

func newRoot() *cobra.Command {
	var verbose bool
	root := &cobra.Command{
		Use:           "agenthost",
		Short:         "Host coding agents (omp, pi) headless, and leave no process behind",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "log diagnostics to stderr")
	logger := func() *slog.Logger {
		if !verbose {
			return slog.New(slog.DiscardHandler)
		}
		return slog.New(slog.NewTextHandler(root.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	isVerbose := func() bool { return verbose }
	root.AddCommand(newPromptCmd(logger, isVerbose), newDoctorCmd(logger), newBenchCmd(), newReapCmd(), newServeCmd(isVerbose),
		newRoomsCmd(), newSendCmd(), newEventsCmd(), newApproveCmd(), newAnswerCmd(),
		newProcdCmd(isVerbose), newProcCmd(), newModelCmd())
	return root
}
