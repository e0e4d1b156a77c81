package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"github.com/agenthost/agenthost/internal/confine"
	"github.com/spf13/pflag"
)

// confineFlags are --confine, --confine-net and --confine-read (serve and
// prompt), and serve's --agent-uids ("": off).
type confineFlags struct {
	mode, net, uids string
	read            []string
}

func addConfineFlags(fl *pflag.FlagSet, f *confineFlags) {
	fl.StringVar(&f.mode, "confine", string(confine.ModeAuto),
		"confine each agent and what it starts with Landlock: auto (when the kernel has it), landlock (refuse to start without it) or off")
	fl.StringVar(&f.net, "confine-net", "any",
		"network for confined agents: any, or the TCP ports they may connect to, comma-separated (the built-in model's and the room tools' are added; bind is denied)")
	fl.StringSliceVar(&f.read, "confine-read", nil,
		"more folders confined agents may read (never write or execute), comma-separated: a custom agent's interpreter installed outside the system's folders (never the data dir or the workspaces)")
}

// addAgentUIDsFlag adds serve's --agent-uids.
func addAgentUIDsFlag(fl *pflag.FlagSet, f *confineFlags) {
	fl.StringVar(&f.uids, "agent-uids", confine.DefaultAgentUIDs.String(),
		"when the server runs as root, each room's agent runs as a uid (and gid) of its own from FIRST-LAST, which owns the room's workspace and home; off: as the server's user")
}

// check refuses bad values (exit 2) before anything starts.
func (f confineFlags) check() error {
	if _, err := confine.ParseMode(f.mode); err != nil {
		return &exitError{2, err}
	}
	if _, err := confine.ParseNet(f.net); err != nil {
		return &exitError{2, err}
	}
	if _, err := f.agentUIDs(); err != nil {
		return &exitError{2, err}
	}
	if err := confine.CheckRead(f.read, nil); err != nil {
		return &exitError{2, err}
	}
	return nil
}

// checkRead refuses a --confine-read folder that is, holds or lies in one
// of private (serve's data dir and workspaces), exit 2.
func (f confineFlags) checkRead(private ...string) error {
	if err := confine.CheckRead(f.read, private); err != nil {
		return &exitError{2, fmt.Errorf("--confine-read: %w", err)}
	}
	return nil
}

// agentUIDs is --agent-uids' range (empty: off, or not given).
func (f confineFlags) agentUIDs() (confine.UIDRange, error) {
	if f.uids == "" {
		return confine.UIDRange{}, nil
	}
	return confine.ParseUIDs(f.uids)
}

// enforced reports whether the flags confine agents on this kernel.
func (f confineFlags) enforced() bool {
	mode, err := confine.ParseMode(f.mode)
	if err != nil {
		return false
	}
	c, err := confine.New(confine.Options{Mode: mode})
	return err == nil && c.Enforced()
}

// confiner resolves the flags on this kernel; modelURL's port (the built-in
// model's), and those of more URLs the agents must reach (the tracing
// relay), are added to a port list. It warns when auto falls back.
func (f confineFlags) confiner(log *slog.Logger, tools, modelURL string, more ...string) (*confine.Confiner, error) {
	mode, err := confine.ParseMode(f.mode)
	if err != nil {
		return nil, &exitError{2, err}
	}
	ports, err := confine.ParseNet(f.net)
	if err != nil {
		return nil, &exitError{2, err}
	}
	uids, err := f.agentUIDs()
	if err != nil {
		return nil, &exitError{2, err}
	}
	var extra []uint16
	for _, u := range append([]string{modelURL}, more...) {
		if p := urlPort(u); p != 0 {
			extra = append(extra, p)
		}
	}
	c, err := confine.New(confine.Options{Mode: mode, Net: ports, Ports: extra, Tools: tools, AgentUIDs: uids, Read: f.read})
	if err != nil {
		return nil, err
	}
	if w := c.Warning(); w != "" {
		log.Warn("confinement: " + w)
	}
	return c, nil
}

// urlPort is the port of an http(s) URL (0 when it names none).
func urlPort(raw string) uint16 {
	if raw == "" {
		return 0
	}
	u, err := url.Parse(raw)
	if err != nil {
		return 0
	}
	p := u.Port()
	if p == "" {
		switch u.Scheme {
		case "http":
			return 80
		case "https":
			return 443
		}
		return 0
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return 0
	}
	return uint16(n)
}

// confineReport is one line on what confines the agents.
func confineReport(r confine.Report) string {
	net := "any network"
	if r.Net != nil {
		net = fmt.Sprintf("TCP connect to ports %v only", r.Net)
	}
	if r.Mode == confine.ReportNone {
		return "none (agents run unconfined)"
	}
	return fmt.Sprintf("landlock (ABI %d; signals scoped: %v; %s)", r.ABI, r.Signals, net)
}

// agentWhere is where prompt's agent lives: the tools folder, its home
// (a throwaway one), the built-in model's URL, and the folder omp's
// process starts in ("" for the workspace).
type agentWhere struct {
	tools, home, modelURL, startDir string
}

// wrap confines prompt's agent to cwd (default: the working directory),
// its home and a TMPDIR of its own, rewriting argv and env; cleanup
// removes the TMPDIR. The policy is nil when agents run unconfined.
func (f confineFlags) wrap(log *slog.Logger, where agentWhere, cwd string, argv, env *[]string) (func(), *confine.Policy, error) {
	c, err := f.confiner(log, where.tools, where.modelURL)
	if err != nil {
		return nil, nil, err
	}
	if !c.Enforced() {
		return func() {}, nil, nil
	}
	if cwd == "" {
		if cwd, err = os.Getwd(); err != nil {
			return nil, nil, err
		}
	}
	if cwd, err = filepath.Abs(cwd); err != nil {
		return nil, nil, err
	}
	tmp, err := os.MkdirTemp("", "agenthost-tmp-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(tmp) }
	p, err := c.Policy(confine.Room{Workspace: cwd, Home: where.home, Tmp: tmp, Exec: (*argv)[:1]})
	if err == nil {
		*argv, *env, err = p.Wrap(*argv, *env)
	}
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	log.Debug("the agent runs confined: " + confineReport(p.Report()))
	return cleanup, p, nil
}

// printAgentUsers says at start that rooms' agents run as uids of their
// own, when they do.
func printAgentUsers(w io.Writer, c *confine.Confiner) {
	if r := c.AgentUsers(); !r.Empty() {
		fmt.Fprintf(w, "agenthost: each room's agent runs as a uid of its own (%s)\n", r)
	}
}
