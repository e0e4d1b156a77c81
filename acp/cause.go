package acp

import (
	"regexp"
	"strings"
)

// causeRE matches a line of an agent's stderr that names why it failed
// (an exception, an error, a refusal), as opposed to a stack frame, a
// source excerpt or a runtime's banner ("Node.js v20.20.2").
var causeRE = regexp.MustCompile(`(?i)(error|exception|fatal|panic|cannot|can't|could not|couldn't|failed|not found|no such|denied|not permitted|eacces|enoent|eperm|unable|missing|invalid|unknown|refused)`)

// frameRE matches the lines that repeat where the failure happened rather
// than what it was: stack frames (Node, Bun, Python, Go) and carets.
var frameRE = regexp.MustCompile(`^\s*(at |File "|\^|~|goroutine |\S+\.go:\d+|\d+ \|)`)

// causeLine is the line of stderr that best says why the agent failed: the
// last line naming an error that is not a stack frame, else the last line.
func causeLine(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !frameRE.MatchString(lines[i]) && causeRE.MatchString(l) {
			return l
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}
