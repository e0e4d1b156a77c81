package acp

import (
	"errors"
	"testing"
)

// The message names the line that says why, not Bun's last stack frame.
func TestExitErrorNamesTheCause(t *testing.T) {
	e := &ExitError{Status: errors.New("exit status 1"), Stderr: "SQLiteError: unable to open database file\n      errno: 14,\n        at new Database (bun:sqlite:260:28)\n        at dRe (/x/cli.js:153:5412)"}
	if got, want := e.Error(), "acp: the agent exited (exit status 1); stderr: SQLiteError: unable to open database file"; got != want {
		t.Fatalf("%q\nwant %q", got, want)
	}
}
