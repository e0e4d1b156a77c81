package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/room"
	"github.com/spf13/cobra"
)

func newConfigCmd() *cobra.Command {
	var f clientFlags
	var sets []string
	cmd := &cobra.Command{
		Use:   "config ROOM [--set key=value ...]",
		Short: "Show or change a room's settings (model, instructions, approval mode, timeouts, budget, ...)",
		Long: `Show a room's effective settings: its own, with the server's defaults filled
in. With --set, change them: each key=value replaces one setting of what the
server answered (budget.tokens=1000000 for a field of the budget,
resources.memory=2G for a limit of the room's processes; mcp, budget and
resources take JSON objects too), and the whole object is sent back; the room is
created if needed. A value is read as JSON when it is valid JSON (5, 0.5,
true, {"a":1}), else as a string (a model name, "5m"). next_start lists the
settings the room's running agent does not have yet: they take effect at its
next start. --json prints the server's answer.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, s := range sets {
				if k, _, ok := strings.Cut(s, "="); !ok || k == "" {
					return usageErr(fmt.Errorf("config: --set %q: want key=value", s))
				}
			}
			return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) (client.RoomConfig, error) {
				cfg, err := c.Config(ctx, args[0])
				if len(sets) == 0 {
					return cfg, err
				}
				if err != nil && !isNotFound(err) {
					return cfg, err
				}
				if err != nil && setsBudget(sets) {
					// A new room: created with the server's defaults
					// first, so that budget.turns=5 changes that limit
					// and keeps the default others (a budget sent
					// replaces the defaults of all its limits).
					if cfg, err = c.SetConfig(ctx, args[0], client.RoomConfig{}); err != nil {
						return cfg, err
					}
				}
				if cfg, err = applySets(cfg, sets); err != nil {
					return cfg, usageErr(err)
				}
				return c.SetConfig(ctx, args[0], cfg)
			}, printConfig)
		},
	}
	f.add(cmd)
	cmd.Flags().StringArrayVar(&sets, "set", nil, "key=value: change one setting (repeatable)")
	return cmd
}

// isNotFound: a room with no settings and no message yet (--set creates
// it).
func isNotFound(err error) bool { return errors.Is(err, client.ErrNotFound) }

// setsBudget: one of sets changes the budget.
func setsBudget(sets []string) bool {
	for _, s := range sets {
		if k, _, _ := strings.Cut(s, "="); k == "budget" || strings.HasPrefix(k, "budget.") {
			return true
		}
	}
	return false
}

// applySets changes cfg by each key=value (dotted keys reach into objects).
func applySets(cfg client.RoomConfig, sets []string) (client.RoomConfig, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return cfg, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return cfg, err
	}
	delete(m, "next_start")
	for _, s := range sets {
		k, v, _ := strings.Cut(s, "=")
		var val any = v
		var js any
		if json.Unmarshal([]byte(v), &js) == nil {
			val = js
		}
		if str, ok := val.(string); ok && k == "resources.memory" {
			n, err := room.ParseBytes(str)
			if err != nil {
				return cfg, fmt.Errorf("config: %s: %w", k, err)
			}
			val = n
		}
		path := strings.Split(k, ".")
		obj := m
		for _, p := range path[:len(path)-1] {
			next, ok := obj[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				obj[p] = next
			}
			obj = next
		}
		obj[path[len(path)-1]] = val
	}
	b, err = json.Marshal(m)
	if err != nil {
		return cfg, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var out client.RoomConfig
	if err := dec.Decode(&out); err != nil {
		return cfg, setError(err)
	}
	return out, nil
}

// setError says which setting a --set value does not fit and what it
// takes, in the settings' own names (never Go's types).
func setError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if i := strings.LastIndex(field, "budget."); i > 0 {
			field = field[i:] // Go's path repeats the struct: Budget.budget.turns
		}
		want := map[string]string{
			"string":  "text",
			"int64":   "a whole number (0 is no limit)",
			"float64": "a number (0 is no limit)",
			"bool":    "true or false",
		}[te.Type.Kind().String()]
		if strings.HasSuffix(field, "_timeout") || field == "idle_after" {
			want = `a Go duration such as "90s" or "5m"`
		}
		if want == "" {
			want = "a JSON " + te.Type.Kind().String()
		}
		article := "a "
		if te.Value == "array" || te.Value == "object" {
			article = "an "
		}
		return fmt.Errorf("config: %s takes %s, not %s%s (see agenthost config --help)", field, want, article, te.Value)
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if name, ok := strings.CutPrefix(msg, "unknown field "); ok {
		return fmt.Errorf("config: no setting %s (agenthost config ROOM lists them)", name)
	}
	return fmt.Errorf("config: %s", msg)
}

// printConfig writes the settings one per line.
func printConfig(w io.Writer, c client.RoomConfig) error {
	str := func(s string) string {
		if s == "" {
			return "(default)"
		}
		return s
	}
	mcp, _ := json.Marshal(c.MCP)
	if len(c.MCP) == 0 {
		mcp = []byte("{}")
	}
	budget := func(n int64) string {
		if n == 0 {
			return "none"
		}
		return fmt.Sprint(n)
	}
	var b client.Budget
	if c.Budget != nil {
		b = *c.Budget
	}
	usd := "none"
	if b.CostUSD > 0 {
		usd = fmt.Sprintf("$%g", b.CostUSD)
	}
	limit := func(n int64, s string) string {
		if n == 0 {
			return "none"
		}
		return s
	}
	instr := c.Instructions
	if len(instr) > 60 {
		instr = instr[:60] + "…"
	}
	lines := [][2]string{
		{"agent", str(c.Agent)}, {"model", str(c.Model)}, {"thinking", str(c.Thinking)}, {"instructions", strings.ReplaceAll(str(instr), "\n", " ")},
		{"approval_mode", c.ApprovalMode}, {"turn_timeout", c.TurnTimeout}, {"approval_timeout", c.ApprovalTimeout},
		{"question_timeout", c.QuestionTimeout}, {"idle_after", c.IdleAfter},
		{"mcp", string(mcp)}, {"budget.tokens", budget(b.Tokens)}, {"budget.cost_usd", usd}, {"budget.turns", budget(b.Turns)},
		{"resources.memory", limit(c.Resources.Memory, room.FormatBytes(c.Resources.Memory))},
		{"resources.pids", limit(c.Resources.Pids, fmt.Sprint(c.Resources.Pids))},
		{"resources.cpu", limit(int64(c.Resources.CPU*1000), fmt.Sprintf("%g cores", c.Resources.CPU))},
	}
	for _, l := range lines {
		if _, err := fmt.Fprintf(w, "%-17s %s\n", l[0]+":", l[1]); err != nil {
			return err
		}
	}
	if len(c.NextStart) > 0 {
		_, err := fmt.Fprintf(w, "at the agent's next start: %s\n", strings.Join(c.NextStart, ", "))
		return err
	}
	return nil
}
