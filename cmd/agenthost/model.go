package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agenthost/agenthost/internal/daemonproc"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/procd"
	"github.com/spf13/cobra"
)

// modelRole marks the built-in model's process in the daemon's metadata.
const modelRole = "builtin-model"

// modelStartTimeout bounds starting the built-in model in the daemon.
const modelStartTimeout = 30 * time.Second

// newModelCmd is the built-in model as a process of its own: serve
// --daemon runs it in the process daemon, so that a turn streaming from it
// goes on across a planned restart of the server. It serves until its
// stdin closes or it is signalled.
func newModelCmd() *cobra.Command {
	var data string
	cmd := &cobra.Command{
		Use:    modelRole,
		Short:  "Serve the built-in scripted model (for serve --daemon)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			sim := modelsim.New(modelsim.Options{MaxLog: -1})
			if err := sim.Start(ctx); err != nil {
				return err
			}
			defer sim.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "url %s\n", sim.URL())
			go func() {
				// Stdin's end (the daemon's terminate closes it first) is
				// the signal to stop.
				_, _ = io.Copy(io.Discard, cmd.InOrStdin())
				cancel()
			}()
			<-ctx.Done()
			return nil
		},
	}
	// Unused but for ps: whose model it is.
	cmd.Flags().StringVar(&data, "data", "", "the data dir of the server it serves")
	return cmd
}

// daemonModel returns the URL of the built-in model running in the daemon:
// the one the server before left (a claimed daemon), or a new one.
func daemonModel(ctx context.Context, pd *procd.Client, data string) (string, error) {
	type meta struct {
		Role string `json:"role"`
		URL  string `json:"url"`
	}
	if pd.Claimed() {
		procs, err := pd.List(ctx, procd.ModePipe)
		if err != nil {
			return "", err
		}
		for _, p := range procs {
			var m meta
			if p.Running && json.Unmarshal(p.Metadata, &m) == nil && m.Role == modelRole && m.URL != "" {
				return m.URL, nil
			}
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, modelStartTimeout)
	defer cancel()
	h := daemonproc.Handle{Instance: pd.InstanceID(), Output: filepath.Join(data, "model.out"), Stderr: filepath.Join(data, "model.err")}
	info, err := pd.CreatePipe(ctx, procd.PipeSpec{Argv: []string{exe, modelRole, "--data", data}, Cwd: data, Env: os.Environ(),
		OutputPath: h.Output, StderrPath: h.Stderr, Metadata: json.RawMessage(`{"role":"` + modelRole + `"}`)})
	if err != nil {
		return "", err
	}
	h.ID = info.ID
	p, err := daemonproc.Attach(ctx, pd, h, 0)
	if err != nil {
		return "", err
	}
	defer p.Detach()
	type line struct {
		s   string
		err error
	}
	got := make(chan line, 1)
	go func() {
		s, err := bufio.NewReader(p.Stdout()).ReadString('\n')
		got <- line{s, err}
	}()
	var l line
	select {
	case l = <-got:
	case <-ctx.Done():
		p.CloseOutput()
		<-got
		return "", fmt.Errorf("the built-in model did not start: %w", ctx.Err())
	}
	url, ok := strings.CutPrefix(strings.TrimSpace(l.s), "url ")
	if l.err != nil || !ok {
		return "", errors.New("the built-in model did not start (see model.err in the data dir)")
	}
	b, _ := json.Marshal(meta{Role: modelRole, URL: url})
	if err := pd.SetMetadata(ctx, info.ID, b); err != nil {
		return "", err
	}
	return url, nil
}
