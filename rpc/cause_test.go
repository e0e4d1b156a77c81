package rpc

import (
	"errors"
	"testing"
)

// The message names the line that says why, not Node's closing banner.
func TestExitErrorNamesTheCause(t *testing.T) {
	e := &ExitError{Status: errors.New("exit status 1"), Stderr: "node:internal/modules/cjs/loader:1228\n  throw err;\n  ^\n\nError: Cannot find module '/x/cli.js'\n    at Module._load (node:internal/modules/cjs/loader:1051:27)\n{\n  code: 'MODULE_NOT_FOUND'\n}\n\nNode.js v20.20.2\n"}
	if got, want := e.Error(), "rpc: agent exited: exit status 1 (stderr: Error: Cannot find module '/x/cli.js')"; got != want {
		t.Fatalf("%q\nwant %q", got, want)
	}
	e.Stderr = "just a line\n"
	if got, want := e.Error(), "rpc: agent exited: exit status 1 (stderr: just a line)"; got != want {
		t.Fatalf("%q\nwant %q", got, want)
	}
}
