package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The tools folder holds two npm projects: its own package.json pins what
// serve and prompt use by default (omp, pi, Bun); acp/package.json pins the
// ACP-only agents (claude-agent-acp, codex-acp, copilot), about 1 GB more,
// installed when a command first needs one (EnsureACP) or by
// `make setup-acp`.

// acpProject is the ACP-only agents' npm project, relative to the tools folder.
const acpProject = "acp"

// progressEvery is how often EnsureACP says it is still installing.
const progressEvery = 15 * time.Second

// ErrInstall means installing agents failed.
var ErrInstall = errors.New("agents: install failed")

// ACPDir returns the folder of the ACP-only agents' npm project.
func (in *Install) ACPDir() string { return filepath.Join(in.Dir, acpProject) }

// ACPOnly reports whether agent k is one of the ACP-only agents, which
// live in their own npm project (see EnsureACP).
func ACPOnly(k Kind) bool {
	_, ok := acpPackages[k]
	return ok
}

// missingACP lists the ACP-only packages that are absent or not at the
// version acp/package.json pins ("name@version" each). Without that file
// (an older tools folder) any installed version is taken.
func (in *Install) missingACP() ([]string, error) {
	pins, err := readPins(filepath.Join(in.ACPDir(), "package.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var missing []string
	for _, k := range ACPKinds {
		rel, ok := acpPackages[k]
		if !ok {
			continue
		}
		name := filepath.ToSlash(rel)
		v, verr := in.Version(k)
		switch {
		case pins == nil && verr == nil:
		case pins == nil:
			return nil, fmt.Errorf("%w: %s is not installed and %s has no package.json; run `make setup-acp` in the agenthost checkout",
				ErrNotFound, name, in.ACPDir())
		case verr != nil || v != pins[name]:
			missing = append(missing, name+"@"+pins[name])
		}
	}
	return missing, nil
}

func readPins(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pj struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(b, &pj); err != nil {
		return nil, fmt.Errorf("agents: parsing %s: %w", path, err)
	}
	return pj.Dependencies, nil
}

// EnsureACP installs the ACP-only agents (npm install in ACPDir, from the
// npm registry) unless each is there at its pinned version, saying what it
// does on progress: a line when it starts, one every 15 s while npm runs
// (npm's own output included), and one at the end. Another process
// installing at the same time is waited for (a lock in ACPDir) rather than
// raced. ctx bounds it all; npm is killed when ctx ends.
func (in *Install) EnsureACP(ctx context.Context, progress io.Writer) error {
	missing, err := in.missingACP()
	if err != nil || len(missing) == 0 {
		return err
	}
	unlock, err := lockDir(ctx, in.ACPDir(), progress)
	if err != nil {
		return err
	}
	defer unlock()
	// Another process may have installed them while this one waited.
	if missing, err = in.missingACP(); err != nil || len(missing) == 0 {
		return err
	}
	if _, err := exec.LookPath("npm"); err != nil {
		return fmt.Errorf("%w: the ACP agents (%s) need installing, and npm is not on PATH", ErrInstall, strings.Join(missing, ", "))
	}
	fmt.Fprintf(progress, "agenthost: installing the ACP agents (%s) from the npm registry into %s: about 1 GB, a few minutes\n",
		strings.Join(missing, ", "), in.ACPDir())
	began := time.Now()
	cmd := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = in.ACPDir()
	var tail bytes.Buffer
	out := &tailWriter{w: progress, tail: &tail}
	cmd.Stdout, cmd.Stderr = out, out
	prepareInstall(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%w: starting npm: %v", ErrInstall, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-tick.C:
			fmt.Fprintf(progress, "agenthost: still installing the ACP agents (%s)\n", time.Since(began).Round(time.Second))
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: installing the ACP agents: %w", ErrInstall, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("%w: npm install in %s: %v: %s", ErrInstall, in.ACPDir(), err, lastLine(tail.String()))
	}
	if missing, err = in.missingACP(); err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: still missing after npm install in %s: %s", ErrInstall, in.ACPDir(), strings.Join(missing, ", "))
	}
	if err := os.MkdirAll(in.CacheDir(), 0o755); err != nil {
		return fmt.Errorf("agents: %w", err)
	}
	fmt.Fprintf(progress, "agenthost: the ACP agents are installed (%s)\n", time.Since(began).Round(time.Second))
	return nil
}

// tailWriter passes npm's output on and keeps its last 4 KiB for the error.
type tailWriter struct {
	w    io.Writer
	tail *bytes.Buffer
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.tail.Write(p)
	if n := t.tail.Len(); n > 4096 {
		t.tail.Next(n - 4096)
	}
	_, _ = t.w.Write(p)
	return len(p), nil
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := slices.DeleteFunc(strings.Split(s, "\n"), func(l string) bool { return strings.TrimSpace(l) == "" })
	if len(lines) == 0 {
		return "no output"
	}
	return strings.TrimSpace(lines[len(lines)-1])
}
