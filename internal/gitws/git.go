package gitws

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"time"
)

// GitError is a git command that failed: the step, the repository (redacted), how git ended and
// the tail of what it wrote to stderr (redacted). It unwraps to the context's error when the
// context ended the command, so errors.Is(err, context.DeadlineExceeded) holds then.
type GitError struct {
	// Op is the step that failed: "ls-remote", "fetch", "init", "checkout", ...
	Op string
	// URL is the repository, without userinfo; "" for steps on local folders only.
	URL string
	// Err is why: an *exec.ExitError, the context's error, or a failure to start git.
	Err error
	// Stderr is the end of git's stderr, redacted.
	Stderr string
}

func (e *GitError) Error() string {
	var b strings.Builder
	b.WriteString("gitws: git ")
	b.WriteString(e.Op)
	if e.URL != "" {
		b.WriteString(" ")
		b.WriteString(e.URL)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	if msg := causeLine(e.Stderr); msg != "" {
		b.WriteString(": ")
		b.WriteString(msg)
	}
	return b.String()
}

func (e *GitError) Unwrap() error { return e.Err }

// causeLine is the line of git's stderr that says why it failed, bounded:
// its first "fatal:" or "error:" line (git may follow it with hints, such
// as "Please make sure you have the correct access rights / and the
// repository exists."), else its last non-empty line.
func causeLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	line := strings.TrimSpace(lines[len(lines)-1])
	for _, l := range lines {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "fatal:") || strings.HasPrefix(l, "error:") {
			line = l
			break
		}
	}
	if len(line) > 300 {
		line = line[:300] + "…"
	}
	return line
}

const (
	// maxStdout bounds what a git command's stdout may hold (ls-remote lists of a repository
	// with very many refs); past it the command fails.
	maxStdout = 8 << 20
	// maxStderr is how much of the end of git's stderr errors keep.
	maxStderr = 4 << 10
	// defaultWaitDelay bounds how long a killed git's descendants may hold its pipes open.
	defaultWaitDelay = 5 * time.Second
)

// errTooMuchOutput means a git command wrote more than maxStdout.
var errTooMuchOutput = errors.New("gitws: git wrote more output than expected")

// call is one git invocation.
type call struct {
	op string
	// args follow git's own; the engine puts its settings in front.
	args []string
	// remote, when set, makes this a network step: it runs with the host's git configuration
	// (credential helpers, url rewrites, proxies, ssh settings) and its URL is redacted from
	// messages. Local steps run with no host configuration at all.
	remote *remote
}

// run runs git and returns its stdout. Every run: no hooks (core.hooksPath is an empty folder),
// no prompts (GIT_TERMINAL_PROMPT=0, an empty GIT_ASKPASS, ssh in BatchMode), only the file,
// https and ssh transports, no automatic gc or maintenance, no repository discovery, its own
// session and process group, which is killed when ctx ends.
func (e *Engine) run(ctx context.Context, c call) ([]byte, error) {
	args := []string{
		"-c", "core.hooksPath=" + e.emptyDir,
		"-c", "core.fsmonitor=false",
		"-c", "gc.auto=0",
		"-c", "maintenance.auto=false",
		"-c", "advice.detachedHead=false",
		"-c", "init.defaultBranch=main",
	}
	args = append(args, c.args...)
	cmd := exec.CommandContext(ctx, e.opts.Git, args...)
	cmd.Dir = e.emptyDir
	cmd.Env = e.env(c.remote != nil)
	setGroup(cmd)
	cmd.WaitDelay = e.opts.WaitDelay
	var out, errb tailBuffer
	out.max, out.head = maxStdout, true
	errb.max = maxStderr
	cmd.Stdout, cmd.Stderr = &out, &errb

	start := time.Now()
	err := cmd.Run()
	url := ""
	if c.remote != nil {
		url = c.remote.redacted
	}
	e.log.Debug("gitws: git", "op", c.op, "url", url, "duration", time.Since(start), "ok", err == nil)
	if err == nil && out.over {
		err = errTooMuchOutput
	}
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		stderr := errb.String()
		if c.remote != nil {
			stderr = strings.ReplaceAll(strings.ReplaceAll(stderr, c.remote.raw, c.remote.redacted), c.remote.arg, c.remote.redacted)
		}
		return nil, &GitError{Op: c.op, URL: url, Err: err, Stderr: Redact(stderr)}
	}
	return out.buf, nil
}

// env is git's environment: the host's (Options.Env) without git's own variables, then the
// engine's settings. A network step keeps the host's git configuration files and ssh settings;
// a local step reads no configuration but the repository's own (which the engine writes).
func (e *Engine) env(network bool) []string {
	keep := map[string]bool{}
	if network {
		for _, k := range []string{"GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH",
			"GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM"} {
			keep[k] = true
		}
	}
	env := make([]string, 0, len(e.opts.Env)+16)
	sshSet := false
	for _, kv := range e.opts.Env {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "GIT_") && !keep[name]:
			continue
		case name == "LC_ALL" || name == "LANGUAGE" || name == "SSH_ASKPASS" || name == "SSH_ASKPASS_REQUIRE":
			continue
		case !network && (name == "HOME" || name == "XDG_CONFIG_HOME"):
			continue
		case name == "GIT_SSH" || name == "GIT_SSH_COMMAND":
			sshSet = true
		}
		env = append(env, kv)
	}
	env = append(env,
		"LC_ALL=C", // git's messages in English, for the errors we pass on
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=", // set and empty: git asks no askpass program (core.askPass, SSH_ASKPASS) either
		"SSH_ASKPASS=", "SSH_ASKPASS_REQUIRE=never",
		"GCM_INTERACTIVE=never", // Git Credential Manager: no dialogs
		"GIT_ALLOW_PROTOCOL=file:https:ssh",
		"GIT_CEILING_DIRECTORIES="+e.opts.Root,
		"GIT_NO_REPLACE_OBJECTS=1",
		// No fetch from a promisor remote on a missing object, in git and in the upload-pack
		// a local fetch starts in the source repository (whose configuration, a promisor
		// remote with core.sshCommand, say, is not the engine's).
		"GIT_NO_LAZY_FETCH=1",
	)
	if network && !sshSet {
		// The host's own ssh: its agent, keys and known_hosts, but never a prompt.
		env = append(env, "GIT_SSH_COMMAND=ssh -o BatchMode=yes")
	}
	if !network {
		env = append(env, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL="+os.DevNull,
			"HOME="+e.emptyDir, "XDG_CONFIG_HOME="+e.emptyDir)
	}
	return env
}

// tailBuffer keeps the first max bytes written (head) or the last max bytes (tail). It never
// fails a write, so git is never stopped by a full pipe.
type tailBuffer struct {
	max  int
	head bool
	buf  []byte
	over bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if t.head {
		if room := t.max - len(t.buf); room < len(p) {
			t.over = true
			p = p[:max(room, 0)]
		}
		t.buf = append(t.buf, p...)
		return n, nil
	}
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.over = true
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return n, nil
}

func (t *tailBuffer) String() string { return string(t.buf) }
