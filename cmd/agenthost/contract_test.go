package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/client"
)

// TestServeCustomCommandSettings: on `serve -- COMMAND` the effective
// settings go back as they are (the agent they name is the server's own
// kind, which it takes), `config --set` works, and another agent name is
// refused naming the one the server runs. A room's budget of 0 lifts the
// server's default budget; a budget left out keeps it.
func TestServeCustomCommandSettings(t *testing.T) {
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	url, token, _ := startServe(t, "--data", data, "--confine", "off", "--room-budget-tokens", "100000", "--room-budget-usd", "2.5",
		"--", "/bin/false")
	t.Setenv("AGENTHOST_URL", url)
	c, err := client.New(url, client.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := c.SetConfig(ctx, "r", client.RoomConfig{Instructions: "x"}); err != nil {
		t.Fatalf("PUT config: %v", err)
	}
	got, err := c.Config(ctx, "r")
	if err != nil || got.Agent != "omp" || got.Budget == nil || *got.Budget != (client.Budget{Tokens: 100000, CostUSD: 2.5}) {
		t.Fatalf("GET config: %+v %v", got, err)
	}
	back, err := c.SetConfig(ctx, "r", got)
	if err != nil || back.Agent != got.Agent || back.Instructions != "x" || *back.Budget != *got.Budget {
		t.Fatalf("the effective settings PUT back: %+v %v", back, err)
	}
	var ae *client.APIError
	if _, err := c.SetConfig(ctx, "r", client.RoomConfig{Agent: "pi"}); !errors.Is(err, client.ErrBadRequest) || !errors.As(err, &ae) ||
		!strings.Contains(ae.Message, `agent "pi": this server runs omp`) {
		t.Fatalf("another agent: %v", err)
	}
	if out, errs, code := runCLI(t, "config", "r", "--set", "instructions=y", "--data", data); code != 0 || !strings.Contains(out, "instructions:     y\n") {
		t.Fatalf("config --set: %d %q %q", code, out, errs)
	}

	if e, err := c.SetConfig(ctx, "r", client.RoomConfig{Budget: &client.Budget{}}); err != nil || *e.Budget != (client.Budget{}) {
		t.Fatalf("a budget of zeros (no limit): %+v %v", e.Budget, err)
	}
	if e, err := c.SetConfig(ctx, "r", client.RoomConfig{}); err != nil || *e.Budget != (client.Budget{Tokens: 100000, CostUSD: 2.5}) {
		t.Fatalf("no budget (the server's): %+v %v", e.Budget, err)
	}
	out, errs, code := runCLI(t, "config", "r", "--set", "budget.tokens=0", "--data", data)
	if code != 0 || !strings.Contains(out, "budget.tokens:    none\n") || !strings.Contains(out, "budget.cost_usd:  $2.5\n") {
		t.Fatalf("config --set budget.tokens=0: %d %q %q", code, out, errs)
	}
	// A new room: one limit set, the server's others kept.
	out, errs, code = runCLI(t, "config", "new", "--set", "budget.turns=3", "--data", data)
	if code != 0 || !strings.Contains(out, "budget.tokens:    100000\n") || !strings.Contains(out, "budget.turns:     3\n") {
		t.Fatalf("config --set budget.turns=3 of a new room: %d %q %q", code, out, errs)
	}
}
