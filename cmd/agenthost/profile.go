package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"
)

// addCPUProfile gives root the hidden --cpuprofile FILE flag: a CPU
// profile of the whole command, from the end of flag parsing to the
// command's return (agenthost bench profiles agenthost prompt with it).
// The returned stop ends the profile and closes the file; run calls it
// once the command has returned.
func addCPUProfile(root *cobra.Command) (stop func() error) {
	var path string
	var f *os.File
	root.PersistentFlags().StringVar(&path, "cpuprofile", "", "write a CPU profile of the command to `FILE`")
	_ = root.PersistentFlags().MarkHidden("cpuprofile")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if path == "" {
			return nil
		}
		var err error
		if f, err = os.Create(path); err != nil {
			return &exitError{2, fmt.Errorf("--cpuprofile: %w", err)}
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			f = nil
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		return nil
	}
	return func() error {
		if f == nil {
			return nil
		}
		pprof.StopCPUProfile()
		err := f.Close()
		f = nil
		return err
	}
}
