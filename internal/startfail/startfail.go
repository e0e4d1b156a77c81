// Package startfail explains why an agent failed to start, from what it
// wrote to stderr: the line that names the cause, the last lines of its
// stderr (redacted and bounded) and what to check, and, for a confined
// agent whose files lie outside what its confinement lets it read (an
// interpreter installed in a user's home), that confinement denied them
// and how to allow them (--confine-read, read-only).
//
// Both transports and prompt wrap their start errors with Explain, so the
// error a person sees (prompt's, a room's turn.ended reason) says it.
package startfail

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/detail"
)

// Bounds of the stderr an Error keeps.
const (
	// MaxLines is how many of stderr's last lines are kept.
	MaxLines = 12
	// MaxLine bounds each kept line, in bytes.
	MaxLine = 240
)

// Info is what is known of the agent that failed to start.
type Info struct {
	// Command is the agent's command as given (before confinement wraps
	// it); its first element is the program.
	Command []string
	// Custom: the command is the operator's (serve -- COMMAND, a room's
	// command), not an installed omp or pi.
	Custom bool
	// Policy is the agent's confinement (nil: unconfined).
	Policy *confine.Policy
	// Allow is the flag that gives agents a folder to read, as the
	// person types it ("serve --confine-read").
	Allow string
}

// Error is a start failure with what the agent's stderr says about it.
type Error struct {
	Err error
	// Cause is the stderr line that names the cause ("" when the agent
	// wrote nothing).
	Cause string
	// Denied is a folder the confinement kept from the agent that it
	// seems to need ("" when none is seen); Why says how that was seen;
	// Write: the agent meant to write there (which no flag allows).
	Denied, Why string
	Write       bool
	// Hint says what to check.
	Hint string
	// Tail is the last lines of the agent's stderr, redacted and bounded.
	Tail []string
}

// Error is the start error, what to check, then the last lines of the
// agent's stderr (indented) when there is more of it than the cause.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	if e.Hint != "" {
		b.WriteString("; " + e.Hint)
	}
	if len(e.Tail) > 1 {
		fmt.Fprintf(&b, "\nthe agent's stderr ended with:")
		for _, l := range e.Tail {
			b.WriteString("\n  " + l)
		}
	}
	return b.String()
}

// Unwrap returns the start error.
func (e *Error) Unwrap() error { return e.Err }

// Explain wraps err, an agent's failure to start, with what stderr (the
// tail of what it wrote there) says about it. err itself is returned when
// it is nil or already explained.
func Explain(err error, stderr string, in Info) error {
	if err == nil {
		return nil
	}
	var done *Error
	if errors.As(err, &done) {
		return err
	}
	e := &Error{Err: err, Tail: tail(stderr)}
	if len(e.Tail) > 0 {
		e.Cause = CauseLine(strings.Join(e.Tail, "\n"))
	}
	e.Denied, e.Why, e.Write = denied(in, stderr)
	e.Hint = hint(in, e)
	return e
}

// tail is the last MaxLines non-empty lines of s, redacted and bounded.
func tail(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		l = strings.TrimRight(l, " \t\r")
		if strings.TrimSpace(l) == "" {
			continue
		}
		l = detail.Redact(l)
		if len(l) > MaxLine {
			l = l[:MaxLine] + "…"
		}
		out = append(out, strings.ToValidUTF8(l, "?"))
	}
	if len(out) > MaxLines {
		out = out[len(out)-MaxLines:]
	}
	return out
}

// causeRE matches a line that names why a program failed (an exception, an
// error, a refusal); frameRE the lines that only say where (stack frames,
// carets). The same choice as the rpc and acp clients' messages.
var (
	causeRE = regexp.MustCompile(`(?i)(error|exception|fatal|panic|cannot|can't|could not|couldn't|failed|not found|no such|denied|not permitted|eacces|enoent|eperm|unable|missing|invalid|unknown|refused)`)
	frameRE = regexp.MustCompile(`^\s*(at |File "|\^|~|goroutine |\S+\.go:\d+|\d+ \|)`)
	// pathRE finds absolute paths in stderr.
	pathRE = regexp.MustCompile(`(?:^|[\s'"(=:])(/[A-Za-z0-9._@+~-][^\s'"():,]*)`)
	// libraryRE matches an interpreter that could not read its own
	// library (Python's path configuration dump, a loader's missing
	// shared object).
	libraryRE = regexp.MustCompile(`Python path configuration:|No module named 'encodings'|Could not find platform (in)?dependent libraries|error while loading shared libraries|cannot open shared object file`)
	// writeRE matches a failure to create or write a file.
	writeRE = regexp.MustCompile(`(?i)(unable to open database|read-only file system|erofs|mkdir|cannot create|could not create|can't create|failed to create|failed to write|cannot write|could not write|open for writing)`)
	// deniedRE matches a refusal to open a file.
	deniedRE = regexp.MustCompile(`(?i)(permission denied|eacces|operation not permitted|eperm)`)
)

// CauseLine is the line of stderr that best says why: the last naming an
// error that is not a stack frame, else the last line.
func CauseLine(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !frameRE.MatchString(lines[i]) && causeRE.MatchString(l) {
			return l
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// denied is the folder a confined agent seems to need and may not read,
// and how that was seen: the install of its program (a program outside the
// system's folders runs, but its interpreter's libraries beside it are not
// readable), or a folder stderr names. "" when unconfined or none is seen.
func denied(in Info, stderr string) (dir, why string, write bool) {
	if in.Policy == nil {
		return "", "", false
	}
	if len(in.Command) > 0 {
		if prog := program(in.Command[0]); prog != "" {
			root := installRoot(prog)
			if root != "" && !in.Policy.Reads(root) && (libraryRE.MatchString(stderr) || strings.Contains(stderr, root+"/")) {
				return root, "its program's files are there", false
			}
		}
	}
	for _, line := range strings.Split(stderr, "\n") {
		for _, m := range pathRE.FindAllStringSubmatch(line, -1) {
			p := filepath.Clean(m[1])
			if real, err := filepath.EvalSymlinks(p); err == nil {
				p = real
			} else if !deniedRE.MatchString(line) && !writeRE.MatchString(line) {
				continue
			}
			if in.Policy.Reads(p) {
				continue
			}
			// The folder that holds it, as far as it exists.
			for p != "/" {
				if fi, err := os.Stat(p); err == nil && fi.IsDir() {
					break
				}
				p = filepath.Dir(p)
			}
			if p == "/" || in.Policy.Reads(p) {
				continue
			}
			return p, "its stderr names it", writeRE.MatchString(line)
		}
	}
	return "", "", false
}

// program is the file name runs (looked up on PATH, links resolved); ""
// when it cannot be found.
func program(name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		return ""
	}
	if p, err = filepath.Abs(p); err != nil {
		return ""
	}
	if p, err = filepath.EvalSymlinks(p); err != nil {
		return ""
	}
	return p
}

// installRoot is the folder a program's own files live in: the parent of
// its bin folder (a pyenv or nvm install: bin/python3 beside lib/), else
// its own folder.
func installRoot(prog string) string {
	dir := filepath.Dir(prog)
	if filepath.Base(dir) == "bin" && filepath.Dir(dir) != "/" {
		return filepath.Dir(dir)
	}
	return dir
}

// hint says what to check.
func hint(in Info, e *Error) string {
	allow := in.Allow
	if allow == "" {
		allow = "serve --confine-read"
	}
	switch {
	case e.Denied != "" && e.Write:
		return fmt.Sprintf("the agent runs confined and may not write %s (its stderr names it): confinement denied it; a confined agent writes only its workspace, its own home and its temporary folder: point the agent's state there (its HOME or its own setting), or run it unconfined (--confine off)", e.Denied)
	case e.Denied != "":
		h := fmt.Sprintf("the agent runs confined and may not read %s (%s): confinement denied it; to let the agents read it (never write), give %s %s", e.Denied, e.Why, allow, e.Denied)
		if in.Policy.User != nil {
			h += fmt.Sprintf(" (they run as uids of their own, uid %d here: the folder must be readable by others too)", in.Policy.User.UID)
		}
		return h
	case len(e.Tail) == 0 && in.Custom:
		return fmt.Sprintf("it wrote nothing to stderr: check that %q runs and speaks the agent's protocol on stdin and stdout", commandName(in))
	case len(e.Tail) == 0:
		return "it wrote nothing to stderr: check the installed agents with agenthost doctor"
	case in.Custom:
		return fmt.Sprintf("check what it says by running %q yourself", commandName(in))
	}
	return "check what it says, and the installed agents with agenthost doctor"
}

func commandName(in Info) string {
	if len(in.Command) == 0 {
		return "the agent's command"
	}
	return strings.Join(in.Command, " ")
}
