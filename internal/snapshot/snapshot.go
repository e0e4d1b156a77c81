// Package snapshot records a workspace's files into a shadow git
// repository that lives outside it, tells what changed between two
// records, and brings the workspace back to an earlier one.
//
// A Repo is one workspace's shadow repository: a bare git directory with
// its own index, so each snapshot re-reads only the files whose stat data
// changed since the last one (git's index is the stat cache). The
// workspace's own .git (a repository, a worktree's link file, or none) is
// never read or written: git skips every path named .git, and the shadow
// repository is addressed by GIT_DIR alone.
//
// Left out of every snapshot, and listed in its Report: new paths ignored
// by the workspace's .gitignore files (nested ones too), files over
// Options.MaxFileSize, nested git repositories and special files. Restore
// leaves them alone unless they stand where a file it restores goes.
//
// Ignore rules work as they do for git's tracked files: they keep paths
// out of the record only until a snapshot has recorded them. A recorded
// file stays recorded whatever ignore rule later matches it, so a
// .gitignore written during a turn (or a repository's "*") never makes a
// changed or unchanged file look deleted, and never keeps its change out
// of a diff. Restore brings back every file the target snapshot holds,
// whatever the ignore files say by then: an ignored file or link in the way
// (where the snapshot has a file, or a folder above one) is replaced, and
// the restored files are recorded again.
//
// The engine runs the system git (2.32 or newer) with a scrubbed
// environment and forced settings, so neither the user's, the system's nor
// the workspace's git configuration or attributes change what is stored or
// run a program (no hooks, filters, fsmonitor, textconv or external diff).
//
// Linux and the other Unix systems are supported in full. Elsewhere the
// package compiles, but a second Repo on the same directory is not
// detected and a cancelled git call kills git alone, not its children.
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// Defaults for Options.
const (
	// DefaultMaxFileSize is the largest file a snapshot records: bigger
	// ones are usually build outputs, media or data the agent fetched, and
	// would make every snapshot and diff slow.
	DefaultMaxFileSize = 10 << 20
	// DefaultMaxReported bounds the paths a Report lists.
	DefaultMaxReported = 1000
)

// MinGitVersion is the oldest git the engine runs with: GIT_CONFIG_GLOBAL
// (2.32) is how the user's own configuration is kept out.
const MinGitVersion = "2.32"

// ref is the branch that keeps every snapshot reachable, each commit the
// child of the one before.
const ref = "refs/heads/snapshots"

var (
	// ErrClosed is returned by calls after Close, and by calls that Close
	// interrupted.
	ErrClosed = errors.New("snapshot: repository closed")
	// ErrLocked is returned by Open when another Repo (in this process or
	// another) has the shadow repository open.
	ErrLocked = errors.New("snapshot: repository in use")
	// ErrWorkspace is returned for a workspace that cannot be snapshotted:
	// missing, not a directory, a symbolic link, or holding the shadow
	// repository.
	ErrWorkspace = errors.New("snapshot: unusable workspace")
	// ErrGit is returned by Open when no usable git is found (missing, or
	// older than MinGitVersion).
	ErrGit = errors.New("snapshot: no usable git")
	// ErrUnknownSnapshot is returned for an ID that names no snapshot of
	// this repository (malformed, unknown, or another kind of object).
	ErrUnknownSnapshot = errors.New("snapshot: unknown snapshot")
)

// ID names one snapshot: the hex name of its commit in the shadow
// repository. Two snapshots in a row of an unchanged workspace have the
// same ID.
type ID string

var idPattern = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)

// valid says whether id has the shape of an object name, so nothing else
// (a revision expression, an option) ever reaches git's command line.
func (id ID) valid() bool { return idPattern.MatchString(string(id)) }

// Options configure a Repo. The zero value is usable.
type Options struct {
	// MaxFileSize is the largest file, in bytes, a snapshot records
	// (default 10 MiB); bigger ones are left out and reported.
	MaxFileSize int64
	// MaxReported bounds the left-out paths a Report lists (default
	// 1000); the rest are only counted.
	MaxReported int
	// Git is the git binary (default: "git" looked up in PATH).
	Git string
}

func (o *Options) fill() {
	if o.MaxFileSize <= 0 {
		o.MaxFileSize = DefaultMaxFileSize
	}
	if o.MaxReported <= 0 {
		o.MaxReported = DefaultMaxReported
	}
	if o.Git == "" {
		o.Git = "git"
	}
}

// Reason says why a path was left out of a snapshot.
type Reason string

// Reasons a path is left out.
const (
	// ReasonIgnored: matched by a .gitignore of the workspace. A wholly
	// ignored directory is listed once, with a trailing slash.
	ReasonIgnored Reason = "ignored"
	// ReasonTooLarge: a file over Options.MaxFileSize.
	ReasonTooLarge Reason = "too_large"
	// ReasonRepository: a nested git repository (listed with a trailing
	// slash); its files are its own repository's business.
	ReasonRepository Reason = "repository"
	// ReasonUnreadable: a file the host may not read.
	ReasonUnreadable Reason = "unreadable"
	// ReasonSpecial: neither a regular file nor a symbolic link (a FIFO,
	// a socket, a device) where a recorded file was; git's walk passes
	// over the others without listing them.
	ReasonSpecial Reason = "special"
)

func (r Reason) String() string { return string(r) }

// Skipped is one path left out of a snapshot.
type Skipped struct {
	// Path is relative to the workspace, with forward slashes.
	Path   string `json:"path"`
	Reason Reason `json:"reason"`
	// Size is the file's size, for ReasonTooLarge.
	Size int64 `json:"size,omitempty"`
}

// Report tells what one snapshot read and what it left out.
type Report struct {
	// Updated counts the paths this snapshot read again (added, changed
	// or removed since the previous one): the incremental part of its
	// work. The first snapshot reads every file.
	Updated int `json:"updated"`
	// Skipped lists the paths left out, sorted, at most MaxReported.
	Skipped []Skipped `json:"skipped,omitempty"`
	// SkippedOmitted counts the left-out paths beyond MaxReported.
	SkippedOmitted int `json:"skipped_omitted,omitempty"`
}

// Repo is the shadow repository of one workspace. Create it with Open and
// Close it when done. Safe for concurrent use: snapshots and restores of
// one Repo run one at a time; diffs run beside them. Different Repos
// share nothing.
type Repo struct {
	dir       string // the shadow repository (a bare git directory)
	workspace string
	opts      Options
	git       string   // resolved binary
	env       []string // every git call's environment
	lock      *os.File

	// life ends when Close begins; every call's context ends with it.
	life   context.Context
	cancel context.CancelFunc

	mu     sync.Mutex // guards closed and calls' registration in wg
	closed bool
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	// sem serialises the calls that change the index or the workspace.
	sem chan struct{}
	// head is the latest snapshot and headTree its tree ("" before the
	// first); guarded by sem.
	head     ID
	headTree string
}

// Open opens the shadow repository in dir for workspace, creating it if
// needed. dir must not lie inside the workspace (nor the workspace inside
// dir), and the workspace must be an existing directory, not a symbolic
// link. ctx bounds the git calls Open makes. The Repo holds dir
// exclusively until Close: a second Open of it fails with ErrLocked
// (after a short grace: see lockGrace).
func Open(ctx context.Context, dir, workspace string, opts Options) (*Repo, error) {
	opts.fill()
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if workspace, err = filepath.Abs(workspace); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if err := checkWorkspace(workspace); err != nil {
		return nil, err
	}
	if err := checkApart(dir, workspace); err != nil {
		return nil, err
	}
	git, err := exec.LookPath(opts.Git)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrGit, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	lock, err := lockFile(ctx, filepath.Join(dir, "agenthost.lock"), lockGrace)
	if err != nil {
		return nil, err
	}
	life, cancel := context.WithCancel(context.Background())
	r := &Repo{dir: dir, workspace: workspace, opts: opts, git: git, lock: lock, life: life, cancel: cancel,
		sem: make(chan struct{}, 1)}
	r.env = gitEnv(dir, workspace)
	if err := r.init(ctx); err != nil {
		cancel()
		_ = lock.Close()
		return nil, err
	}
	return r, nil
}

// checkWorkspace refuses a workspace that is not a directory or is a
// symbolic link (whose target could change under the engine).
func checkWorkspace(workspace string) error {
	fi, err := os.Lstat(workspace)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrWorkspace, err)
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link", ErrWorkspace, workspace)
	case !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory", ErrWorkspace, workspace)
	}
	return nil
}

// checkApart refuses a shadow repository inside the workspace (the agent
// could rewrite its history) or a workspace inside it.
func checkApart(dir, workspace string) error {
	real := func(p string) string {
		// The deepest existing ancestor decides where p really is.
		var rest []string
		for {
			if r, err := filepath.EvalSymlinks(p); err == nil {
				return filepath.Join(append([]string{r}, rest...)...)
			}
			parent := filepath.Dir(p)
			if parent == p {
				return p
			}
			rest = append([]string{filepath.Base(p)}, rest...)
			p = parent
		}
	}
	d, w := real(dir), real(workspace)
	within := func(a, b string) bool { // a within b
		rel, err := filepath.Rel(b, a)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
	}
	if within(d, w) || within(w, d) {
		return fmt.Errorf("%w: the shadow repository %s and the workspace %s overlap", ErrWorkspace, dir, workspace)
	}
	return nil
}

// Close interrupts the calls in flight (they return ErrClosed), waits for
// them, and releases the shadow repository. Later calls return ErrClosed.
// Close is idempotent: every call returns once the first is done.
func (r *Repo) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.cancel()
		r.wg.Wait()
		r.closeErr = r.lock.Close()
	})
	return r.closeErr
}

// begin registers a call and gives it a context that also ends when Close
// begins; end must be called when the call returns.
func (r *Repo) begin(ctx context.Context) (context.Context, func(), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, nil, ErrClosed
	}
	r.wg.Add(1)
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(r.life, func() { cancel(ErrClosed) })
	return ctx, func() {
		stop()
		cancel(nil)
		r.wg.Done()
	}, nil
}

// acquire takes the right to change the index and the workspace, waiting
// behind the calls that hold it.
func (r *Repo) acquire(ctx context.Context) error {
	select {
	case r.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctxErr(ctx)
	}
}

func (r *Repo) release() { <-r.sem }

// ctxErr is the error for an ended call: ErrClosed when Close ended it,
// else the context's own error (context.Canceled or DeadlineExceeded).
func ctxErr(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrClosed) {
		return ErrClosed
	}
	return ctx.Err()
}

// Snapshot records the workspace as it is now and returns the snapshot's
// ID with a report of what it read and left out. It waits behind the
// Repo's other snapshots and restores; ctx bounds the wait and every git
// call (a cancelled call kills git and returns ctx's error, leaving the
// repository usable).
func (r *Repo) Snapshot(ctx context.Context) (ID, Report, error) {
	ctx, end, err := r.begin(ctx)
	if err != nil {
		return "", Report{}, err
	}
	defer end()
	if err := r.acquire(ctx); err != nil {
		return "", Report{}, err
	}
	defer r.release()
	t, err := r.snapshot(ctx, nil)
	return t.id, t.report, err
}

// taken is what one snapshot recorded and found.
type taken struct {
	id     ID
	report Report
	// ignored are the paths left out as ignored (a wholly ignored folder
	// with a trailing slash), all of them.
	ignored map[string]bool
}

// snapshot does Snapshot's work; the caller holds sem. force are paths to
// record though an ignore rule matches them (the files a restore wrote).
func (r *Repo) snapshot(ctx context.Context, force []string) (taken, error) {
	if err := checkWorkspace(r.workspace); err != nil {
		return taken{}, err
	}
	r.removeStaleLocks()
	// One walk of the workspace tells what changed since the index was
	// written (status hashes only the files whose stat data changed), what
	// is new, and what is ignored.
	out, err := r.output(ctx, nil, "status", "--porcelain=v2", "-z", "--untracked-files=all", "--ignored=matching",
		"--no-renames", "--ignore-submodules=all")
	if err != nil {
		return taken{}, err
	}
	st := parseStatus(out)
	if len(force) > 0 {
		forced := map[string]bool{}
		for _, p := range force {
			forced[p] = true
			st.changed = append(st.changed, lsEntry{tag: '?', path: p})
		}
		st.ignored = slices.DeleteFunc(st.ignored, func(e lsEntry) bool { return forced[e.path] })
	}
	plan, err := r.plan(st.changed, st.ignored)
	if err != nil {
		return taken{}, err
	}
	if len(plan.forget) > 0 {
		if err := r.run(ctx, nulList(plan.forget), "update-index", "-z", "--force-remove", "--stdin"); err != nil {
			return taken{}, err
		}
	}
	switch {
	case len(plan.files) >= bulkFiles:
		if err := r.bulkUpdate(ctx, &plan); err != nil {
			return taken{}, err
		}
	case len(plan.update) > 0:
		if err := r.run(ctx, nulList(plan.update), "update-index", "-z", "--add", "--remove", "--replace", "--stdin"); err != nil {
			return taken{}, err
		}
	}
	id := r.head
	if r.head == "" || st.staged || len(plan.update) > 0 || len(plan.forget) > 0 {
		if id, err = r.commit(ctx); err != nil {
			return taken{}, err
		}
	}
	rep := Report{Updated: len(plan.update) + len(plan.forget)}
	ignored := map[string]bool{}
	for _, e := range st.ignored {
		ignored[e.path] = true
	}
	slices.SortFunc(plan.skipped, func(a, b Skipped) int { return strings.Compare(a.Path, b.Path) })
	if n := len(plan.skipped); n > r.opts.MaxReported {
		rep.SkippedOmitted = n - r.opts.MaxReported
		plan.skipped = plan.skipped[:r.opts.MaxReported]
	}
	rep.Skipped = plan.skipped
	return taken{id: id, report: rep, ignored: ignored}, nil
}

// plan is what a snapshot does to the index.
type plan struct {
	update  []string  // paths to read again (dropped when gone)
	files   []planned // those of update that exist, files or links
	forget  []string  // paths to drop though git could read them: ignored, too large...
	skipped []Skipped
}

// planned is a file or link a snapshot reads.
type planned struct {
	path string
	mode string // as git records it: 100644, 100755 or 120000
}

// plan decides, from ls-files' listings, which paths a snapshot reads and
// which it leaves out.
func (r *Repo) plan(changed, ignored []lsEntry) (plan, error) {
	var p plan
	forget := map[string]bool{}
	// Ignored paths are never recorded ones (status lists those as
	// changed, whatever the ignore files say): they stay out.
	for _, e := range ignored {
		p.skipped = append(p.skipped, Skipped{Path: e.path, Reason: ReasonIgnored})
	}
	seen := map[string]bool{}
	realDirs := map[string]bool{}
	for _, e := range changed {
		if seen[e.path] || forget[e.path] {
			continue
		}
		seen[e.path] = true
		if strings.HasSuffix(e.path, "/") { // git lists a nested repository as a directory
			p.skipped = append(p.skipped, Skipped{Path: e.path, Reason: ReasonRepository})
			continue
		}
		tracked := e.tag != '?'
		leave := func(s Skipped) {
			p.skipped = append(p.skipped, s)
			if tracked {
				forget[e.path] = true
			}
		}
		abs := filepath.Join(r.workspace, filepath.FromSlash(e.path))
		under, err := r.underRealDirs(e.path, realDirs)
		if err != nil {
			return plan{}, err
		}
		if !under {
			// A parent became a link or a file: what was recorded under it
			// is gone (git would refuse to look past the link).
			forget[e.path] = true
			continue
		}
		fi, err := os.Lstat(abs)
		switch {
		case err != nil:
			if !errors.Is(err, os.ErrNotExist) {
				return plan{}, fmt.Errorf("snapshot: %w", err)
			}
			p.update = append(p.update, e.path) // gone: --remove drops it
		case fi.IsDir():
			// A file became a directory: --remove drops the file, and the
			// directory's files are listed on their own.
			p.update = append(p.update, e.path)
		case fi.Mode()&os.ModeSymlink != 0:
			p.update = append(p.update, e.path)
			p.files = append(p.files, planned{path: e.path, mode: "120000"})
		case !fi.Mode().IsRegular():
			leave(Skipped{Path: e.path, Reason: ReasonSpecial})
		case fi.Size() > r.opts.MaxFileSize:
			leave(Skipped{Path: e.path, Reason: ReasonTooLarge, Size: fi.Size()})
		case !readable(abs):
			leave(Skipped{Path: e.path, Reason: ReasonUnreadable})
		default:
			p.update = append(p.update, e.path)
			mode := "100644"
			if fi.Mode()&0o100 != 0 { // git records the owner's executable bit
				mode = "100755"
			}
			p.files = append(p.files, planned{path: e.path, mode: mode})
		}
	}
	for path := range forget {
		p.forget = append(p.forget, path)
	}
	slices.Sort(p.forget)
	return p, nil
}

// underRealDirs says whether every parent directory of path (relative to
// the workspace) is a real directory, not a link or a file; known caches
// the answers for the directories seen so far.
func (r *Repo) underRealDirs(path string, known map[string]bool) (bool, error) {
	dir, _ := splitDir(path)
	if dir == "" {
		return true, nil
	}
	if ok, seen := known[dir]; seen {
		return ok, nil
	}
	ok, err := r.underRealDirs(dir, known)
	if err != nil || !ok {
		known[dir] = false
		return false, err
	}
	fi, err := os.Lstat(filepath.Join(r.workspace, filepath.FromSlash(dir)))
	switch {
	case err == nil:
		ok = fi.IsDir()
	case errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		ok = false
	default:
		return false, fmt.Errorf("snapshot: %w", err)
	}
	known[dir] = ok
	return ok, nil
}

// splitDir splits a slash-separated path into its directory ("" at the
// top) and its name.
func splitDir(path string) (dir, name string) {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[:i], path[i+1:]
	}
	return "", path
}

// commit writes the index as a tree and, when it differs from the latest
// snapshot's, records it as a new snapshot commit. The caller holds sem.
func (r *Repo) commit(ctx context.Context) (ID, error) {
	out, err := r.output(ctx, nil, "write-tree")
	if err != nil {
		return "", err
	}
	tree := strings.TrimSpace(string(out))
	if r.head != "" && tree == r.headTree {
		return r.head, nil
	}
	args := []string{"commit-tree", tree, "-m", "snapshot"}
	if r.head != "" {
		args = append(args, "-p", string(r.head))
	}
	if out, err = r.output(ctx, nil, args...); err != nil {
		return "", err
	}
	id := ID(strings.TrimSpace(string(out)))
	if !id.valid() {
		return "", fmt.Errorf("snapshot: git commit-tree printed %q", out)
	}
	old := string(r.head)
	if old == "" {
		old = strings.Repeat("0", len(id)) // the ref must not exist yet
	}
	if err := r.run(ctx, nil, "update-ref", ref, string(id), old); err != nil {
		return "", err
	}
	r.head, r.headTree = id, tree
	return id, nil
}
