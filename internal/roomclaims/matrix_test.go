package roomclaims

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
)

var update = flag.Bool("update", false, "rewrite docs/support-matrix.md from the claims table")

// matrixPath is the generated document, relative to this package.
var matrixPath = filepath.Join("..", "..", "docs", "support-matrix.md")

// TestMatrix fails when docs/support-matrix.md differs from what the claims table says; -update
// rewrites it.
func TestMatrix(t *testing.T) {
	want := renderMatrix(pinnedVersions(t))
	if *update {
		if err := os.WriteFile(matrixPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(matrixPath)
	if err != nil {
		t.Fatalf("%v (generate it: go test ./internal/roomclaims -run Matrix -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from the claims table: regenerate it with go test ./internal/roomclaims -run Matrix -update", matrixPath)
	}
}

// TestTable checks the table itself: every gap names a claim, every path runs or names each claim.
func TestTable(t *testing.T) {
	ids := map[string]bool{}
	for _, c := range claims {
		if ids[c.id] {
			t.Errorf("claim %s twice", c.id)
		}
		ids[c.id] = true
		for _, tr := range []string{"rpc", "acp"} {
			if c.how[tr] == "" && !gapOnAll(c.id, tr) {
				t.Errorf("claim %s: no how for %s, which some path keeps", c.id, tr)
			}
		}
	}
	for _, p := range paths {
		for id, reason := range p.gaps {
			if !ids[id] || reason == "" {
				t.Errorf("path %s: gap %q (%q) names no claim or no reason", p.id, id, reason)
			}
		}
		for id := range p.how {
			if !ids[id] {
				t.Errorf("path %s: how for unknown claim %q", p.id, id)
			}
		}
		for id := range p.instead {
			if _, gap := p.gaps[id]; !ids[id] || gap {
				t.Errorf("path %s: instead for unknown or gap claim %q", p.id, id)
			}
		}
	}
}

// gapOnAll reports whether every path of transport tr has a gap for claim id.
func gapOnAll(id, tr string) bool {
	for _, p := range paths {
		if _, gap := p.gaps[id]; p.transport == tr && !gap {
			return false
		}
	}
	return true
}

// renderMatrix writes the support matrix from the table.
func renderMatrix(pins map[agents.Kind]string) []byte {
	var b bytes.Buffer
	b.WriteString("# Support matrix\n\n")
	b.WriteString("<!-- Generated from internal/roomclaims/table_test.go by `go test ./internal/roomclaims -run Matrix -update`; do not edit. -->\n\n")
	b.WriteString("What a room promises on each transport and agent. Every **yes** is a claim that `TestClaims` in\n")
	b.WriteString("`internal/roomclaims` runs against the real agent on the built-in scripted model (part of `make test`);\n")
	b.WriteString("every **gap** is a named skip there, with the reason below. The document is generated from that\n")
	b.WriteString("table, and a test fails when the two differ. Every claim runs with the agent confined (Landlock, as\n")
	b.WriteString("`serve --confine landlock --confine-net` with no port of its own: the model's and the room tools' only).\n\n")
	b.WriteString("Tested versions (pinned in `.tools/package.json` and, for the ACP agents, `.tools/acp/package.json`; installed by `make setup` and `make setup-acp`):\n\n")
	fmt.Fprintf(&b, "- **omp rpc**: omp %s (`omp --mode rpc`, on Bun), transport `internal/rpcagent`\n", pins[agents.OMP])
	fmt.Fprintf(&b, "- **pi rpc**: pi %s (`pi --mode rpc`, on Node), transport `internal/rpcagent` with agenthost's pi extension (`internal/rpcagent/piext`)\n", pins[agents.Pi])
	fmt.Fprintf(&b, "- **omp acp**: omp %s (`omp acp`), transport `internal/acpagent`\n", pins[agents.OMP])
	fmt.Fprintf(&b, "- **claude**: claude-agent-acp %s (runs the Claude Code CLI), transport `internal/acpagent`\n", pins[agents.Claude])
	fmt.Fprintf(&b, "- **codex**: codex-acp %s (runs the codex CLI), transport `internal/acpagent`\n", pins[agents.Codex])
	fmt.Fprintf(&b, "- **copilot**: copilot %s (`copilot --acp`), transport `internal/acpagent`\n\n", pins[agents.Copilot])

	b.WriteString("| claim |")
	for _, p := range paths {
		fmt.Fprintf(&b, " %s |", p.id)
	}
	b.WriteString("\n|---|")
	for range paths {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, c := range claims {
		fmt.Fprintf(&b, "| [%s](#%s) |", c.id, c.id)
		for _, p := range paths {
			if _, gap := p.gaps[c.id]; gap {
				b.WriteString(" **gap** |")
			} else {
				b.WriteString(" yes |")
			}
		}
		b.WriteString("\n")
	}

	b.WriteString("\n## Claims\n")
	for _, c := range claims {
		fmt.Fprintf(&b, "\n### %s\n\n%s.\n\n", c.id, c.title)
		for _, p := range paths {
			if reason, gap := p.gaps[c.id]; gap {
				fmt.Fprintf(&b, "- %s: **gap**: %s.\n", p.id, reason)
				continue
			}
			how := c.how[p.transport]
			if own := p.instead[c.id]; own != "" {
				how = own
			}
			if extra := p.how[c.id]; extra != "" {
				how += "; " + extra
			}
			fmt.Fprintf(&b, "- %s: yes: %s.\n", p.id, how)
		}
	}
	return b.Bytes()
}
