// Package gitws gives rooms workspaces from git: rooms on the same repository share one cached
// mirror, and each room gets its own working tree at its ref.
//
// Layout under Options.Root:
//
//	mirrors/<hash>.git   one bare mirror per repository (hash of the normalised URL)
//	worktrees/<room>     a room's working tree (unless Options.Worktree puts it elsewhere)
//	rooms/<room>.json    what the engine prepared for a room (no credentials: the URL is redacted)
//	empty/               an empty folder: git's hooks path, working folder and HOME
//
// A room's working tree is a repository of its own (its .git is a folder inside the tree) at a
// detached HEAD on the ref's commit, whose objects are borrowed from the mirror through
// objects/info/alternates: a checkout costs writing the files, not copying history, and nothing
// a room does to its repository (config, hooks, refs) reaches the mirror or another room. The
// engine never runs git inside a room's tree after handing it over. The mirror is never garbage
// collected (gc.auto=0), so borrowed objects never vanish; it is deleted when the last room
// using it is removed.
//
// Which repositories a room may name: https and ssh ones, and file:// ones only under
// Options.FileRoots, never in the engine's Root or Options.Denied (see Engine.checkFile). No
// credentials go in a URL (see Spec.Git).
//
// Locks: calls for one room run one at a time. A fetch brings one ref (a branch or a tag) into
// the mirror, and one fetch per mirror and ref runs at a time: a prepare that wants a ref being
// fetched shares that fetch and waits for it only as long as its own context lets it (a fetch
// whose own caller gave up is run again by the one still waiting). Fetches of other refs, and
// checkouts of what the mirror already has, never wait for it. The mirror's own lock is held
// only for short local steps (creating it, registering a room on it, deleting it), never
// across a fetch, so a Remove never waits for another room's fetch.
//
// git runs with no hooks, no prompts, no terminal, only the file, https and ssh transports, no
// lazy fetches from promisor remotes (GIT_NO_LAZY_FETCH, honoured by git 2.45 and later; an
// older upload-pack ignores the variable), and is killed (with its process group) when the
// caller's context ends. Steps that reach the network use the host's own git configuration for
// credentials (credential helpers, ssh agent); steps on local folders read no host
// configuration, so nothing there (filters, fsmonitor, attributes files) runs a program when a
// repository's files are checked out. Neither submodules nor Git LFS content is fetched (LFS
// files stay pointer files). Only SHA-1 repositories are supported.
package gitws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"
)

// Sentinel errors; match them with errors.Is. Failures of git itself are *GitError.
var (
	// ErrBadSpec means a Spec or room id the engine refuses (the message says which part).
	ErrBadSpec = errors.New("gitws: bad workspace")
	// ErrUnreachable means the repository could not be reached or read (wrapped with the
	// *GitError that says how).
	ErrUnreachable = errors.New("gitws: repository unreachable")
	// ErrUnknownRef means the repository has no branch, tag or commit of that name.
	ErrUnknownRef = errors.New("gitws: unknown ref")
	// ErrSpecChanged means the room already has a worktree of another repository or ref: Remove
	// it first (which deletes the room's files).
	ErrSpecChanged = errors.New("gitws: the room's worktree is of another workspace")
	// ErrNotEmpty means the room's worktree folder already holds files the engine did not put
	// there.
	ErrNotEmpty = errors.New("gitws: worktree folder is not empty")
)

// MaxRoomLen bounds a room id, in bytes: room ids are up to 128 characters
// (room.MaxIDLen), 4 bytes each at most.
const MaxRoomLen = 512

// cleanupTimeout bounds the cleanup after a failed Prepare, which runs even when the caller's
// context has ended: it waits only for the mirror's lock, which no one holds across a fetch.
const cleanupTimeout = 5 * time.Second

// Options configure an [Engine]. Root is required; the zero value of every other field is a
// working default.
type Options struct {
	// Root is the engine's folder (under the data dir): mirrors, worktrees and records.
	Root string
	// Worktree, if set, gives the folder of a room's worktree (absolute; it must not exist, or
	// be empty, when the room is first prepared). nil puts it at Root/worktrees/<room>.
	Worktree func(room string) string
	// FileRoots are the only folders file:// URLs may name repositories in; none (the zero
	// value) refuses file:// URLs. Whatever it holds, repositories in Root (the mirrors, the
	// rooms' worktrees) or Denied are refused.
	FileRoots []string
	// Denied are folders no file:// URL may reach, whatever FileRoots says: a server lists
	// its data dir and the rooms' workspaces (other rooms' files and snapshots).
	Denied []string
	// Git is the git program; "" means "git" on PATH. Version 2.29 or later.
	Git string
	// Env is the environment git starts from; nil means the host's. git's own variables in it
	// are dropped but for the ssh, TLS and config-file ones.
	Env []string
	// WaitDelay bounds how long a killed git's helpers may hold its pipes; 0 means 5 s.
	WaitDelay time.Duration
	// Logger gets one debug line per git command (step, redacted URL, duration); nil discards.
	Logger *slog.Logger
}

// Ready is a prepared worktree.
type Ready struct {
	// URL is the repository, without userinfo.
	URL string `json:"url"`
	// Ref is the ref as the Spec named it.
	Ref string `json:"ref"`
	// Kind says what Ref named: "branch", "tag" or "commit".
	Kind string `json:"kind"`
	// Commit is the full id of the commit checked out.
	Commit string `json:"commit"`
	// Dir is the worktree's folder.
	Dir string `json:"dir"`
	// Mirror is the shared mirror the worktree borrows its objects from:
	// whatever runs git in the worktree must be able to read it.
	Mirror string `json:"mirror"`
}

// Ref kinds (Ready.Kind).
const (
	KindBranch = "branch"
	KindTag    = "tag"
	KindCommit = "commit"
)

// Engine prepares and removes rooms' worktrees. It is safe for concurrent use (see the package
// doc for what waits for what). It starts no goroutines, so it needs no Close. One Engine per
// Root: two engines (or processes) on one Root are not coordinated.
type Engine struct {
	opts     Options
	log      *slog.Logger
	emptyDir string

	rooms   keyedLocks // per room: its prepare, remove
	mirrors keyedLocks // per mirror: short local steps only
	fetches flights    // per mirror and refspecs: the fetch in progress
}

// New returns an engine on opts.Root, creating the folder if needed. It runs no git.
func New(opts Options) (*Engine, error) {
	if opts.Root == "" {
		return nil, errors.New("gitws: Options.Root is required")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, fmt.Errorf("gitws: root: %w", err)
	}
	opts.Root = root
	// Folders compare by absolute path (a relative one is taken from the current folder now).
	for _, list := range []*[]string{&opts.FileRoots, &opts.Denied} {
		abs := make([]string, 0, len(*list))
		for _, d := range *list {
			if d == "" {
				return nil, errors.New("gitws: an empty folder in Options.FileRoots or Options.Denied")
			}
			a, err := filepath.Abs(d)
			if err != nil {
				return nil, fmt.Errorf("gitws: %w", err)
			}
			abs = append(abs, a)
		}
		*list = abs
	}
	if opts.Git == "" {
		opts.Git = "git"
	}
	if opts.Env == nil {
		opts.Env = os.Environ()
	}
	if opts.WaitDelay == 0 {
		opts.WaitDelay = defaultWaitDelay
	}
	lg := opts.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	e := &Engine{opts: opts, log: lg, emptyDir: filepath.Join(root, "empty")}
	for _, d := range []string{e.emptyDir, filepath.Join(root, "mirrors"), filepath.Join(root, "rooms")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gitws: %w", err)
		}
	}
	// The empty folder must stay empty: it is git's hooks path.
	if entries, err := os.ReadDir(e.emptyDir); err != nil || len(entries) > 0 {
		return nil, fmt.Errorf("gitws: %s must be an empty folder", e.emptyDir)
	}
	return e, nil
}

// Validate checks spec as far as is cheap without a fetch: the URL and ref syntax, that the
// repository answers (git ls-remote, with the host's credentials), and that a branch or tag of
// that name exists. A ref of hex digits that names no branch or tag is taken to be a commit id,
// which only a fetch can check: Prepare fails with ErrUnknownRef if it is not one.
func (e *Engine) Validate(ctx context.Context, spec Spec) error {
	rm, err := e.parseSpec(spec)
	if err != nil {
		return err
	}
	kind, err := e.lsRemote(ctx, rm, spec.Ref)
	if err != nil || kind != "" || hexRef.MatchString(spec.Ref) {
		return err
	}
	return fmt.Errorf("%w: %s has no branch or tag %q", ErrUnknownRef, rm.redacted, spec.Ref)
}

// lsRemote says what ref names in the repository: KindBranch, KindTag, or "" for neither.
func (e *Engine) lsRemote(ctx context.Context, rm remote, ref string) (string, error) {
	out, err := e.run(ctx, call{op: "ls-remote", remote: &rm,
		args: []string{"ls-remote", "--", rm.arg, "refs/heads/" + ref, "refs/tags/" + ref}})
	if err != nil {
		return "", unreachable(err)
	}
	kind := ""
	for line := range strings.SplitSeq(string(out), "\n") {
		_, name, ok := strings.Cut(line, "\t")
		switch {
		case !ok:
		case name == "refs/heads/"+ref:
			return KindBranch, nil
		case strings.TrimSuffix(name, "^{}") == "refs/tags/"+ref:
			kind = KindTag
		}
	}
	return kind, nil
}

// parseSpec checks a Spec's URL and ref, and where a file:// URL points.
func (e *Engine) parseSpec(spec Spec) (remote, error) {
	rm, err := parseRemote(spec.Git)
	if err != nil {
		return remote{}, err
	}
	if err := checkRef(spec.Ref); err != nil {
		return remote{}, err
	}
	if rm.file != "" {
		if rm.arg, err = e.checkFile(rm); err != nil {
			return remote{}, err
		}
	}
	return rm, nil
}

// within reports whether path p is root or below it, by their names alone.
func within(p, root string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// unreachable marks a failed network step as ErrUnreachable, unless the context ended it.
func unreachable(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnreachable, err)
}

// checkRoom refuses room ids the engine cannot name folders and records after.
func checkRoom(room string) error {
	switch {
	case room == "":
		return fmt.Errorf("%w: empty room id", ErrBadSpec)
	case len(room) > MaxRoomLen:
		return fmt.Errorf("%w: room id longer than %d bytes", ErrBadSpec, MaxRoomLen)
	case !utf8.ValidString(room) || strings.ContainsRune(room, 0):
		return fmt.Errorf("%w: room id is not UTF-8 text", ErrBadSpec)
	}
	return nil
}

// Prepare gives room its worktree of spec and returns where it is and what it holds. It fetches
// the repository into the shared mirror (not for a commit id the mirror already has) and checks
// the commit out into the room's folder at a detached HEAD.
//
// It is idempotent: when the room already has its worktree of the same URL and ref, it returns
// it at once, without fetching (so a branch's worktree stays at the commit first checked out).
// A room whose worktree is of another URL or ref gets ErrSpecChanged: Remove it first. A failed
// Prepare leaves nothing behind. Errors: ErrBadSpec, ErrUnreachable, ErrUnknownRef,
// ErrSpecChanged, ErrNotEmpty, the context's error, or a *GitError.
func (e *Engine) Prepare(ctx context.Context, room string, spec Spec) (Ready, error) {
	return e.PrepareAt(ctx, room, e.worktreeDir(room), spec)
}

// PrepareAt is Prepare with the worktree in dir (absolute) rather than where Options.Worktree
// puts it: the caller names each room's folder. A room keeps the folder of its first prepare.
func (e *Engine) PrepareAt(ctx context.Context, room, dir string, spec Spec) (Ready, error) {
	if err := checkRoom(room); err != nil {
		return Ready{}, err
	}
	if !filepath.IsAbs(dir) {
		return Ready{}, fmt.Errorf("%w: worktree folder %q is not absolute", ErrBadSpec, dir)
	}
	rm, err := e.parseSpec(spec)
	if err != nil {
		return Ready{}, err
	}
	unlock, err := e.rooms.lock(ctx, room)
	if err != nil {
		return Ready{}, err
	}
	defer unlock()

	st, err := e.readRecord(room)
	if err != nil {
		return Ready{}, err
	}
	if st != nil {
		exists := isDir(dir)
		switch {
		case st.Status == statusReady && exists && st.Mirror == rm.key && st.Ref == spec.Ref:
			r := st.ready()
			r.Mirror = e.mirrorDir(st.Mirror)
			return r, nil
		case st.Status == statusReady && exists:
			return Ready{}, fmt.Errorf("%w: room %q has %s at %q; remove it first", ErrSpecChanged, room, st.URL, st.Ref)
		}
		// A prepare that never finished (the host stopped), or a worktree deleted from
		// outside: start over.
		if err := removeAll(dir); err != nil {
			return Ready{}, err
		}
	} else if !emptyOrMissing(dir) {
		return Ready{}, fmt.Errorf("%w: %s", ErrNotEmpty, dir)
	}

	rec := record{Room: room, Mirror: rm.key, Git: rm.raw, URL: rm.redacted, Ref: spec.Ref, Dir: dir, Status: statusPreparing}
	ready, err := e.prepare(ctx, rm, rec, st)
	if err != nil {
		// Nothing is left: the half-made worktree, the record, and a mirror no room uses. The
		// mirror's lock is never held across a fetch, so this waits for short steps only.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = removeAll(dir)
		_ = e.removeRecord(room)
		_ = e.pruneMirror(ctx, rm.key)
		return Ready{}, err
	}
	rec.Commit, rec.Kind, rec.Status = ready.Commit, ready.Kind, statusReady
	if err := e.writeRecord(rec); err != nil {
		return Ready{}, err
	}
	ready.Mirror = e.mirrorDir(rm.key)
	return ready, nil
}

// prepare registers the room on the mirror (its record, written while the mirror's lock is held,
// so that a Remove of another room never deletes the mirror under this one), brings the ref
// into the mirror and checks it out. old is the room's earlier record, if any.
func (e *Engine) prepare(ctx context.Context, rm remote, rec record, old *record) (Ready, error) {
	mirror := e.mirrorDir(rm.key)
	unlock, err := e.mirrors.lock(ctx, rm.key)
	if err != nil {
		return Ready{}, err
	}
	err = e.writeRecord(rec)
	if err == nil {
		err = e.ensureMirror(ctx, mirror)
	}
	unlock()
	if err != nil {
		return Ready{}, err
	}
	if old != nil && old.Mirror != rm.key {
		if err := e.pruneMirror(ctx, old.Mirror); err != nil {
			return Ready{}, err
		}
	}
	commit, kind, err := e.sync(ctx, rm, rec.Ref, mirror)
	if err != nil {
		return Ready{}, err
	}
	if err := e.checkout(ctx, mirror, commit, rec.Dir); err != nil {
		return Ready{}, err
	}
	return Ready{URL: rm.redacted, Ref: rec.Ref, Kind: kind, Commit: commit, Dir: rec.Dir}, nil
}

// Remove deletes room's worktree (its files and its repository) and its record, and deletes the
// mirror when no other room uses it. A room without a worktree is left alone (nil).
func (e *Engine) Remove(ctx context.Context, room string) error {
	if err := checkRoom(room); err != nil {
		return err
	}
	unlock, err := e.rooms.lock(ctx, room)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := e.readRecord(room)
	if err != nil || st == nil {
		return err
	}
	if err := removeAll(st.Dir); err != nil {
		return err
	}
	if err := e.removeRecord(room); err != nil {
		return err
	}
	return e.pruneMirror(ctx, st.Mirror)
}

// Get returns room's worktree as Prepare made it, and false when the room has none.
func (e *Engine) Get(room string) (Ready, bool, error) {
	if err := checkRoom(room); err != nil {
		return Ready{}, false, err
	}
	st, err := e.readRecord(room)
	if err != nil || st == nil || st.Status != statusReady {
		return Ready{}, false, err
	}
	r := st.ready()
	r.Mirror = e.mirrorDir(st.Mirror)
	return r, true, nil
}

// Held returns the repository and ref room's worktree holds: one ready, or one being prepared
// right now. false means none (a prepare that never finished starts over with any spec).
func (e *Engine) Held(room string) (Spec, bool, error) {
	st, err := e.held(room)
	if err != nil || st == nil {
		return Spec{}, false, err
	}
	git := st.Git
	if git == "" {
		git = st.URL // a record from before Git was kept
	}
	return Spec{Git: git, Ref: st.Ref}, true, nil
}

func (e *Engine) held(room string) (*record, error) {
	if err := checkRoom(room); err != nil {
		return nil, err
	}
	st, err := e.readRecord(room)
	if err != nil || st == nil {
		return nil, err
	}
	if st.Status == statusReady && isDir(st.Dir) || st.Status == statusPreparing && e.rooms.held(room) {
		return st, nil
	}
	return nil, nil
}

// Admit says whether room may be given spec, with its worktree in dir, as far as is cheap to
// know before the checkout: a room that holds a worktree (or is being given one) takes only
// the same repository and ref again (ErrSpecChanged otherwise), and no network step then; a
// room without one needs dir empty or missing (ErrNotEmpty) and a spec that Validate takes.
func (e *Engine) Admit(ctx context.Context, room, dir string, spec Spec) error {
	rm, err := e.parseSpec(spec)
	if err != nil {
		return err
	}
	st, err := e.held(room)
	if err != nil {
		return err
	}
	if st != nil {
		if st.Mirror == rm.key && st.Ref == spec.Ref {
			return nil
		}
		return fmt.Errorf("%w: room %q has %s at %q", ErrSpecChanged, room, st.URL, st.Ref)
	}
	// A record left by a prepare that never finished: the next prepare starts over, deleting
	// what it left in dir.
	if rec, err := e.readRecord(room); err != nil {
		return err
	} else if rec == nil && !emptyOrMissing(dir) {
		return fmt.Errorf("%w: %s", ErrNotEmpty, dir)
	}
	return e.Validate(ctx, spec)
}

// worktreeDir is where room's worktree goes.
func (e *Engine) worktreeDir(room string) string {
	if e.opts.Worktree != nil {
		return e.opts.Worktree(room)
	}
	return filepath.Join(e.opts.Root, "worktrees", dirName(room))
}

// Record statuses.
const (
	statusPreparing = "preparing"
	statusReady     = "ready"
)

// record is what the engine keeps of a room's worktree, in Root/rooms/<room>.json.
type record struct {
	Room   string `json:"room"`
	Mirror string `json:"mirror"`
	Git    string `json:"git,omitempty"` // as given (it holds no credentials)
	URL    string `json:"url"`           // redacted
	Ref    string `json:"ref"`
	Kind   string `json:"kind,omitempty"`
	Commit string `json:"commit,omitempty"`
	Dir    string `json:"dir"`
	Status string `json:"status"`
}

func (r *record) ready() Ready {
	return Ready{URL: r.URL, Ref: r.Ref, Kind: r.Kind, Commit: r.Commit, Dir: r.Dir}
}

func (e *Engine) recordPath(room string) string {
	return filepath.Join(e.opts.Root, "rooms", dirName(room)+".json")
}

// readRecord returns room's record, or nil when there is none.
func (e *Engine) readRecord(room string) (*record, error) {
	data, err := os.ReadFile(e.recordPath(room))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("gitws: %w", err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil || r.Room != room {
		return nil, fmt.Errorf("gitws: the record of room %q is damaged", room)
	}
	return &r, nil
}

// writeRecord replaces room's record atomically.
func (e *Engine) writeRecord(r record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("gitws: %w", err)
	}
	return writeAtomic(e.recordPath(r.Room), data)
}

func (e *Engine) removeRecord(room string) error {
	if err := os.Remove(e.recordPath(room)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("gitws: %w", err)
	}
	return nil
}

// mirrorInUse reports whether any room's record names the mirror.
func (e *Engine) mirrorInUse(key string) (bool, error) {
	entries, err := os.ReadDir(filepath.Join(e.opts.Root, "rooms"))
	if err != nil {
		return false, fmt.Errorf("gitws: %w", err)
	}
	for _, ent := range entries {
		if !strings.HasSuffix(ent.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(e.opts.Root, "rooms", ent.Name()))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return false, fmt.Errorf("gitws: %w", err)
		}
		var r record
		// A damaged record might name this mirror: keep the mirror.
		if json.Unmarshal(data, &r) != nil || r.Mirror == key {
			return true, nil
		}
	}
	return false, nil
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("gitws: %w", err)
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("gitws: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("gitws: %w", err)
	}
	return nil
}
