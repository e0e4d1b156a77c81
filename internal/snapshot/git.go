package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// waitDelay bounds the wait for git's output pipes after git was killed
// (a child it started could hold them open).
const waitDelay = 2 * time.Second

// stderrKeep bounds the part of git's stderr kept for an error message.
const stderrKeep = 4 << 10

// attributes is written to the shadow repository's info/attributes, which
// takes precedence over every .gitattributes of the workspace: each
// attribute that could change the bytes stored or restored, run a
// program, or hide a diff is reset to unspecified, so the workspace's
// files are recorded exactly as they are.
const attributes = "* !text !eol !crlf !ident !filter !working-tree-encoding !diff !merge\n"

// forcedConfig is set on every git call with the highest precedence (the
// command line's), over anything in the shadow repository's config file.
// The user's and the system's config files are not read at all.
var forcedConfig = [][2]string{
	{"core.hooksPath", os.DevNull},
	{"core.fsmonitor", "false"},
	{"core.untrackedCache", "false"},
	{"core.splitIndex", "false"},
	{"core.sparseCheckout", "false"},
	{"core.autocrlf", "false"},
	{"core.safecrlf", "false"},
	{"core.symlinks", "true"},
	{"core.fileMode", "true"},
	{"core.ignoreCase", "false"},
	{"core.precomposeUnicode", "false"},
	// Names git protects only for checkouts onto NTFS or HFS; the engine
	// never checks out through git, and refusing them would fail the
	// snapshot of a workspace that holds such a name.
	{"core.protectNTFS", "false"},
	{"core.protectHFS", "false"},
	{"core.excludesFile", os.DevNull},
	{"core.attributesFile", os.DevNull},
	{"core.quotePath", "false"},
	{"core.preloadIndex", "true"},
	{"core.useReplaceRefs", "false"},
	{"index.sparse", "false"},
	{"feature.manyFiles", "false"},
	{"feature.experimental", "false"},
	{"gc.auto", "0"},
	{"maintenance.auto", "false"},
	{"commit.gpgSign", "false"},
	{"diff.renames", "false"},
	{"diff.noprefix", "false"},
	{"diff.mnemonicPrefix", "false"},
	{"diff.relative", "false"},
	{"diff.algorithm", "myers"},
	{"diff.context", "3"},
	{"diff.interHunkContext", "0"},
	{"diff.suppressBlankEmpty", "false"},
	{"color.ui", "false"},
	{"submodule.recurse", "false"},
}

// gitEnv is the environment of every git call: the host's without
// anything git reads (GIT_*, HOME and XDG_CONFIG_HOME, which locate the
// user's files), plus the shadow repository, the workspace and the forced
// settings.
func gitEnv(dir, workspace string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(strings.ToUpper(k), "GIT_"),
			k == "HOME", k == "XDG_CONFIG_HOME", k == "EMAIL", k == "LANG", k == "LANGUAGE", strings.HasPrefix(k, "LC_"):
		default:
			env = append(env, kv)
		}
	}
	env = append(env,
		"GIT_DIR="+dir,
		"GIT_WORK_TREE="+workspace,
		"GIT_INDEX_FILE="+filepath.Join(dir, "index"),
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_SYSTEM="+os.DevNull,
		"GIT_CONFIG_GLOBAL="+os.DevNull,
		"GIT_ATTR_NOSYSTEM=1",
		"GIT_NO_REPLACE_OBJECTS=1",
		"GIT_LITERAL_PATHSPECS=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=agenthost", "GIT_AUTHOR_EMAIL=agenthost@localhost",
		"GIT_COMMITTER_NAME=agenthost", "GIT_COMMITTER_EMAIL=agenthost@localhost",
		"LC_ALL=C",
		"GIT_CONFIG_COUNT="+strconv.Itoa(len(forcedConfig)),
	)
	for i, kv := range forcedConfig {
		env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, kv[0]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, kv[1]))
	}
	return env
}

// GitError is a git call that failed (not one a context ended).
type GitError struct {
	// Command is git's subcommand.
	Command string
	// Stderr is the start of what git printed on stderr.
	Stderr string
	Err    error
}

func (e *GitError) Error() string {
	msg := fmt.Sprintf("snapshot: git %s: %v", e.Command, e.Err)
	if s := strings.TrimSpace(e.Stderr); s != "" {
		msg += ": " + s
	}
	return msg
}

func (e *GitError) Unwrap() error { return e.Err }

// headBuffer keeps the first stderrKeep bytes written to it. Safe for
// concurrent use: git may still be writing when a failure reads it.
type headBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *headBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := stderrKeep - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *headBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// command builds a git call in the workspace, killed (with its process
// group where there is one) when ctx ends.
func (r *Repo) command(ctx context.Context, args ...string) (*exec.Cmd, *headBuffer) {
	cmd := exec.CommandContext(ctx, r.git, args...)
	cmd.Env = r.env
	cmd.Dir = r.workspace
	cmd.WaitDelay = waitDelay
	killGroup(cmd)
	stderr := &headBuffer{}
	cmd.Stderr = stderr
	return cmd, stderr
}

// wrap turns a git call's failure into the error callers see.
func wrap(ctx context.Context, args []string, stderr *headBuffer, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("snapshot: git %s: %w", args[0], ctxErr(ctx))
	}
	return &GitError{Command: args[0], Stderr: stderr.String(), Err: err}
}

// output runs git with stdin and returns its stdout.
func (r *Repo) output(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd, stderr := r.command(ctx, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	err := wrap(ctx, args, stderr, cmd.Run())
	return out.Bytes(), err
}

// run runs git with stdin, discarding its stdout.
func (r *Repo) run(ctx context.Context, stdin []byte, args ...string) error {
	_, err := r.output(ctx, stdin, args...)
	return err
}

// outputLimit runs git and returns at most limit bytes of its stdout;
// when there is more, git is stopped and truncated is true.
func (r *Repo) outputLimit(ctx context.Context, limit int, args ...string) (out []byte, truncated bool, err error) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	cmd, stderr := r.command(ctx, args...)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, false, fmt.Errorf("snapshot: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, false, wrap(ctx, args, stderr, err)
	}
	out, readErr := io.ReadAll(io.LimitReader(pipe, int64(limit)+1))
	if len(out) > limit {
		out, truncated = out[:limit], true
		stop() // the rest is not wanted
	}
	err = cmd.Wait()
	if truncated {
		return out, true, nil
	}
	if err == nil && readErr != nil {
		err = readErr
	}
	return out, false, wrap(ctx, args, stderr, err)
}

// init checks git, creates or repairs the shadow repository, and reads
// its latest snapshot.
func (r *Repo) init(ctx context.Context) error {
	out, err := r.output(ctx, nil, "version")
	if err != nil {
		return fmt.Errorf("%w: %w", ErrGit, err)
	}
	if !versionAtLeast(string(out), MinGitVersion) {
		return fmt.Errorf("%w: %s is older than %s", ErrGit, strings.TrimSpace(string(out)), MinGitVersion)
	}
	// Initialising again is harmless, and repairs a repository whose
	// creation was interrupted.
	initArgs := []string{"init", "--bare", "--quiet", "--template=", "--initial-branch=snapshots", r.dir}
	cmd, stderr := r.command(ctx, initArgs...)
	cmd.Env = nil
	for _, kv := range r.env {
		if !strings.HasPrefix(kv, "GIT_DIR=") && !strings.HasPrefix(kv, "GIT_WORK_TREE=") && !strings.HasPrefix(kv, "GIT_INDEX_FILE=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := wrap(ctx, initArgs, stderr, cmd.Run()); err != nil {
		return err
	}
	info := filepath.Join(r.dir, "info")
	if err := os.MkdirAll(info, 0o700); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if b, err := os.ReadFile(filepath.Join(info, "attributes")); err != nil || string(b) != attributes {
		if err := os.WriteFile(filepath.Join(info, "attributes"), []byte(attributes), 0o600); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	r.removeStaleLocks()
	if out, err = r.output(ctx, nil, "for-each-ref", "--format=%(objectname) %(tree)", ref); err != nil {
		return err
	}
	if head, tree, ok := strings.Cut(strings.TrimSpace(string(out)), " "); ok {
		r.head, r.headTree = ID(head), tree
	}
	return nil
}

// removeStaleLocks removes the lock files a killed git leaves behind.
// Only this Repo writes the shadow repository (it holds it exclusively)
// and only under sem or in Open, so any lock file found then is stale.
func (r *Repo) removeStaleLocks() {
	for _, name := range []string{"index.lock", filepath.FromSlash(ref) + ".lock", "HEAD.lock", "packed-refs.lock"} {
		_ = os.Remove(filepath.Join(r.dir, name))
	}
}

// versionAtLeast reads "git version X.Y.Z..." and compares X.Y with min.
func versionAtLeast(out, min string) bool {
	f := strings.Fields(out)
	if len(f) < 3 {
		return false
	}
	have, want := strings.Split(f[2], "."), strings.Split(min, ".")
	for i := range want {
		if i >= len(have) {
			return false
		}
		h, err1 := strconv.Atoi(have[i])
		w, err2 := strconv.Atoi(want[i])
		if err1 != nil || err2 != nil {
			return false
		}
		if h != w {
			return h > w
		}
	}
	return true
}

// lsEntry is one path git listed.
type lsEntry struct {
	tag  byte // '?' not recorded, 'C' recorded and changed or gone
	path string
}

// splitNul splits NUL-terminated records.
func splitNul(out []byte) []string {
	var recs []string
	for len(out) > 0 {
		rec, rest, _ := bytes.Cut(out, []byte{0})
		out = rest
		if len(rec) > 0 {
			recs = append(recs, string(rec))
		}
	}
	return recs
}

// status is what `git status --porcelain=v2 -z` says of the workspace
// against the index, and of the index against the latest snapshot.
type status struct {
	changed []lsEntry // 'C' recorded and changed (or gone), '?' new
	ignored []lsEntry // '?' ignored and not recorded
	// staged is set when the index differs from the latest snapshot (a
	// snapshot was interrupted after updating the index).
	staged bool
}

// parseStatus reads `git status --porcelain=v2 -z` output:
// "1 <XY> <sub> <mH> <mI> <mW> <hH> <hI> <path>\0" for a changed
// recorded path (X: index against HEAD, Y: workspace against index),
// "2 ... <path>\0<orig>\0" for a rename (not asked for), "? <path>\0"
// for a new path, "! <path>\0" for an ignored one.
func parseStatus(out []byte) status {
	var st status
	recs := splitNul(out)
	for i := 0; i < len(recs); i++ {
		rec := recs[i]
		switch {
		case len(rec) < 3:
			// No path: not git's output.
		case strings.HasPrefix(rec, "? "):
			st.changed = append(st.changed, lsEntry{tag: '?', path: rec[2:]})
		case strings.HasPrefix(rec, "! "):
			st.ignored = append(st.ignored, lsEntry{tag: '?', path: rec[2:]})
		case strings.HasPrefix(rec, "1 "), strings.HasPrefix(rec, "2 "):
			n := 9
			if rec[0] == '2' {
				n = 10
				i++ // the original path follows
			}
			f := strings.SplitN(rec, " ", n)
			if len(f) != n || len(f[1]) != 2 || f[n-1] == "" {
				continue
			}
			if f[1][0] != '.' {
				st.staged = true
			}
			if f[1][1] != '.' {
				st.changed = append(st.changed, lsEntry{tag: 'C', path: f[n-1]})
			}
		}
	}
	return st
}

// nulList is paths as git's -z --stdin reads them.
func nulList(paths []string) []byte {
	var b bytes.Buffer
	for _, p := range paths {
		b.WriteString(p)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// checkIDs makes sure each id names a snapshot commit of this repository.
func (r *Repo) checkIDs(ctx context.Context, ids ...ID) error {
	var in bytes.Buffer
	for _, id := range ids {
		if !id.valid() {
			return fmt.Errorf("%w: %q", ErrUnknownSnapshot, id)
		}
		in.WriteString(string(id) + "\n")
	}
	out, err := r.output(ctx, in.Bytes(), "cat-file", "--batch-check=%(objectname) %(objecttype)")
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i, id := range ids {
		if i >= len(lines) || lines[i] != string(id)+" commit" {
			return fmt.Errorf("%w: %s", ErrUnknownSnapshot, id)
		}
	}
	return nil
}
