package transport

import (
	"errors"
	"fmt"

	"github.com/agenthost/agenthost/internal/agents"
)

// Command is how to run one installed agent by hand, outside any room
// (with package rpc or acp): no custody, confinement or approvals but
// what the caller adds.
type Command struct {
	// Argv is the command line (never run through a shell) and Env the
	// whole environment.
	Argv, Env []string
	// Model is the model to select ("" keeps the agent's default).
	Model string
	// SessionMeta, if set, is the _meta to send with ACP's session/new
	// (acp.Options.SessionMeta).
	SessionMeta map[string]any
}

// RPCCommand writes a home for agent ("omp" or "pi") at home, pointed at
// opts.ModelURL (required), and returns how to run the agent in RPC mode
// with it (rpc.Spec's Argv, Env and Model). Of opts it reads Tools,
// ModelURL and AgentEnv.
func RPCCommand(opts Options, agent, home string) (Command, error) {
	if opts.ModelURL == "" {
		return Command{}, errors.New("transport: RPCCommand needs Options.ModelURL")
	}
	in, err := findInstall(opts)
	if err != nil {
		return Command{}, err
	}
	argv, err := in.Argv(agents.Kind(agent))
	if err != nil {
		return Command{}, err
	}
	env, err := agents.HomeWith(home, agents.Kind(agent), opts.ModelURL, agents.HomeOptions{PassEnv: opts.AgentEnv})
	if err != nil {
		return Command{}, err
	}
	return Command{Argv: argv, Env: env, Model: agents.ModelID}, nil
}

// ACPCommand writes a home for agent ("omp", "claude", "codex" or
// "copilot") at home, pointed at opts.ModelURL if set, and returns how to
// run the agent over ACP with it (acp.Spec's Argv and Env, and
// acp.Options.SessionMeta). The agent asks permission for every tool. Of
// opts it reads Tools, ModelURL and AgentEnv.
func ACPCommand(opts Options, agent, home string) (Command, error) {
	in, err := findInstall(opts)
	if err != nil {
		return Command{}, err
	}
	r, err := in.ACP(agents.Kind(agent), agents.ACPOptions{Home: home, ModelURL: opts.ModelURL, PassEnv: opts.AgentEnv})
	if err != nil {
		return Command{}, err
	}
	return Command{Argv: r.Argv, Env: r.Env, Model: r.Model, SessionMeta: r.SessionMeta}, nil
}

// findInstall checks opts.AgentEnv and finds the tools folder.
func findInstall(opts Options) (*agents.Install, error) {
	if err := agents.CheckEnvNames(opts.AgentEnv); err != nil {
		return nil, fmt.Errorf("transport: Options.AgentEnv: %w", err)
	}
	in, err := install(opts.Tools)
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	return in, nil
}
