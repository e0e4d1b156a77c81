// Package agentproc joins the RPC client to process custody: agents spawned
// through Starter run in custody scopes, and the scope's receipt is
// available once the client has closed.
package agentproc

import (
	"context"
	"os/exec"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/rpc"
)

// Starter is an rpc.Starter that starts each agent in its own custody
// scope, with Limits where the Custodian applies them.
type Starter struct {
	Custodian *custody.Custodian
	Limits    custody.Limits
}

var _ rpc.Starter = Starter{}

// Start implements rpc.Starter.
func (s Starter) Start(ctx context.Context, cmd *exec.Cmd) (rpc.Process, error) {
	scope, err := s.Custodian.StartWith(ctx, cmd, custody.StartOptions{Limits: s.Limits})
	if err != nil {
		return nil, err
	}
	return Process{scope}, nil
}

// Process is a custody scope seen as an rpc.Process.
type Process struct {
	*custody.Scope
}

// Stop closes the scope; its receipt is then available from Receipt.
func (p Process) Stop(ctx context.Context) error {
	_, err := p.Scope.Close(ctx)
	return err
}

// Receipt returns the custody receipt of an agent the client owned, once
// the client has closed; nil otherwise (or if it was not started here).
func Receipt(c *rpc.Client) *custody.Receipt {
	if p, ok := c.Process().(Process); ok {
		return p.Receipt()
	}
	return nil
}

// Usage reads what the agent's scope has used (false: not started here).
func Usage(c *rpc.Client) (custody.Usage, bool) {
	if p, ok := c.Process().(Process); ok {
		return p.Usage(), true
	}
	return custody.Usage{}, false
}

// ResetPeak starts a new window for the agent's scope's peak memory.
func ResetPeak(c *rpc.Client) error {
	if p, ok := c.Process().(Process); ok {
		return p.ResetPeak()
	}
	return nil
}

// HoldUntil holds the agent's scope to deadline (see custody's
// Scope.HoldUntil); an agent not started here is not held.
func HoldUntil(c *rpc.Client, deadline time.Time) error {
	if p, ok := c.Process().(Process); ok {
		return p.HoldUntil(deadline)
	}
	return nil
}

// Kill ends the agent's processes at once (custody's Scope.Kill).
func Kill(c *rpc.Client) error {
	if p, ok := c.Process().(Process); ok {
		return p.Kill()
	}
	return nil
}
