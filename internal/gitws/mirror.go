package gitws

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// mirrorConfig is the whole config of every mirror. The engine writes it before each use, so
// nothing written into a mirror's config by anyone else (a room's agent, without confinement)
// stays in effect: no filters, hooks, fsmonitor or alternates but the engine's.
//
// sharedRepository makes what git writes there readable by everyone whatever the server's umask:
// a room's agent running as a uid of its own reads its worktree's objects from the mirror (the
// data dir above keeps other users out, and Landlock other rooms' agents out of mirrors not
// theirs).
const mirrorConfig = `[core]
	repositoryformatversion = 0
	filemode = true
	bare = true
	sharedRepository = 0644
[gc]
	auto = 0
[maintenance]
	auto = false
`

func (e *Engine) mirrorDir(key string) string {
	return filepath.Join(e.opts.Root, "mirrors", key+".git")
}

// sync brings what ref names into the mirror (which exists) and resolves it to a commit; it
// returns the commit and the ref's kind. A commit the mirror has needs no network at all; a
// branch or a tag is fetched alone (see fetch), so a fetch of another ref that hangs holds up
// nothing here.
func (e *Engine) sync(ctx context.Context, rm remote, ref, mirror string) (commit, kind string, err error) {
	// A commit the mirror already has never changes: no fetch.
	if hexRef.MatchString(ref) {
		if c, err := e.resolve(ctx, mirror, ref); err != nil || c != "" {
			return c, KindCommit, err
		}
	}
	kind, err = e.lsRemote(ctx, rm, ref)
	if err != nil {
		return "", "", err
	}
	if kind != "" {
		name := "refs/heads/" + ref
		if kind == KindTag {
			name = "refs/tags/" + ref
		}
		if err := e.fetch(ctx, rm, mirror, false, "+"+name+":"+name); err != nil {
			return "", "", err
		}
		c, err := e.resolve(ctx, mirror, name)
		if err != nil || c != "" {
			return c, kind, err
		}
		return "", "", fmt.Errorf("%w: %s has no %s %q any more", ErrUnknownRef, rm.redacted, kind, ref)
	}
	if !hexRef.MatchString(ref) {
		return "", "", fmt.Errorf("%w: %s has no branch or tag %q", ErrUnknownRef, rm.redacted, ref)
	}
	// A commit no branch or tag reaches: servers that allow it send it when asked by its full id.
	if len(ref) == 40 || len(ref) == 64 {
		if err := e.fetch(ctx, rm, mirror, false, ref); err != nil {
			if ctx.Err() != nil {
				return "", "", err
			}
			e.log.Debug("gitws: fetch by commit id refused", "url", rm.redacted, "err", err)
		}
		if c, err := e.resolve(ctx, mirror, ref); err != nil || c != "" {
			return c, KindCommit, err
		}
	}
	// An abbreviated id, or a server that sends no commit by id: every branch and tag, into refs
	// of their own (so that this fetch never touches a ref another room's fetch writes).
	if err := e.fetch(ctx, rm, mirror, true, "+refs/heads/*:refs/scan/heads/*", "+refs/tags/*:refs/scan/tags/*"); err != nil {
		return "", "", err
	}
	if c, err := e.resolve(ctx, mirror, ref); err != nil || c != "" {
		return c, KindCommit, err
	}
	return "", "", fmt.Errorf("%w: %s has no branch, tag or commit %q", ErrUnknownRef, rm.redacted, ref)
}

// fetch runs git fetch of refspecs into mirror, or shares the same fetch another prepare runs
// (see flights): two fetches never write one ref at once, and fetches of different refs run
// side by side.
func (e *Engine) fetch(ctx context.Context, rm remote, mirror string, prune bool, refspecs ...string) error {
	args := []string{"--git-dir=" + mirror, "fetch", "--quiet", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head"}
	if prune {
		args = append(args, "--prune")
	}
	args = append(append(args, "--", rm.arg), refspecs...)
	key := rm.key + "\x00" + strings.Join(refspecs, "\x00")
	return e.fetches.do(ctx, key, func() error {
		_, err := e.run(ctx, call{op: "fetch", remote: &rm, args: args})
		if err != nil {
			return unreachable(err)
		}
		return nil
	})
}

// resolve returns the commit name names in mirror, or "" when it names none.
func (e *Engine) resolve(ctx context.Context, mirror, name string) (string, error) {
	out, err := e.run(ctx, call{op: "rev-parse", args: []string{"--git-dir=" + mirror,
		"rev-parse", "--verify", "--quiet", "--end-of-options", name + "^{commit}"}})
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 1 && ctx.Err() == nil {
			return "", nil // not a commit here (rev-parse --verify --quiet exits 1 and says nothing)
		}
		return "", err
	}
	c := strings.TrimSpace(string(out))
	if !hexRef.MatchString(c) {
		return "", fmt.Errorf("gitws: git rev-parse gave %q", c)
	}
	return c, nil
}

// ensureMirror creates the mirror if it does not exist (in a temporary folder renamed into
// place, so a crash never leaves half a mirror) and resets what the engine owns in it.
func (e *Engine) ensureMirror(ctx context.Context, mirror string) error {
	if !isDir(mirror) {
		tmp, err := os.MkdirTemp(filepath.Dir(mirror), ".new-*")
		if err != nil {
			return fmt.Errorf("gitws: %w", err)
		}
		if err := os.Chmod(tmp, 0o755); err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("gitws: %w", err)
		}
		if _, err := e.run(ctx, call{op: "init", args: []string{"init", "--quiet", "--bare", "--shared=0644", "--template=", tmp}}); err != nil {
			os.RemoveAll(tmp)
			return err
		}
		if err := os.Rename(tmp, mirror); err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("gitws: %w", err)
		}
	}
	// A mirror made before sharedRepository was a folder of the server's alone.
	if err := os.Chmod(mirror, 0o755); err != nil {
		return fmt.Errorf("gitws: %w", err)
	}
	if err := writeAtomic(filepath.Join(mirror, "config"), []byte(mirrorConfig)); err != nil {
		return err
	}
	for _, f := range []string{"objects/info/alternates", "info/attributes", "commondir"} {
		if err := os.Remove(filepath.Join(mirror, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("gitws: %w", err)
		}
	}
	return nil
}

// checkout makes dir a repository of its own whose objects are borrowed from mirror, at a
// detached HEAD on commit, and checks the files out.
func (e *Engine) checkout(ctx context.Context, mirror, commit, dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("gitws: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("gitws: %w", err)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a plain folder", ErrNotEmpty, dir)
	}
	gitDir := filepath.Join(dir, ".git")
	if _, err := e.run(ctx, call{op: "init", args: []string{"init", "--quiet", "--template=", "--", dir}}); err != nil {
		return err
	}
	alt := filepath.Join(mirror, "objects") + "\n"
	if err := os.WriteFile(filepath.Join(gitDir, "objects", "info", "alternates"), []byte(alt), 0o600); err != nil {
		return fmt.Errorf("gitws: %w", err)
	}
	if _, err := e.run(ctx, call{op: "checkout", args: []string{"--git-dir=" + gitDir, "--work-tree=" + dir,
		"checkout", "--quiet", "--detach", commit, "--"}}); err != nil {
		return err
	}
	return giveToOwner(dir)
}

// pruneMirror deletes the mirror when no room's record names it. A room whose prepare is
// fetching into it has a record naming it, so this never waits for, nor breaks, a fetch.
func (e *Engine) pruneMirror(ctx context.Context, key string) error {
	unlock, err := e.mirrors.lock(ctx, key)
	if err != nil {
		return err
	}
	defer unlock()
	used, err := e.mirrorInUse(key)
	if err != nil || used {
		return err
	}
	return removeAll(e.mirrorDir(key))
}

// dirName maps a room id to a file name: a readable prefix of its plain characters, then a hash
// of the exact id, so ids that differ only in case or in dropped characters never collide.
func dirName(room string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(room) {
		if b.Len() >= 40 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			b.WriteRune(r)
		}
	}
	sum := sha256.Sum256([]byte(room))
	if b.Len() > 0 {
		b.WriteByte('-')
	}
	b.WriteString(hex.EncodeToString(sum[:8]))
	return b.String()
}

func isDir(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}

// emptyOrMissing reports whether p does not exist or is an empty folder.
func emptyOrMissing(p string) bool {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil || !fi.IsDir() {
		return false
	}
	entries, err := os.ReadDir(p)
	return err == nil && len(entries) == 0
}

// removeAll deletes p and everything in it, making read-only folders writable when they stop
// the removal (git's object folders, tools' caches).
func removeAll(p string) error {
	if p == "" {
		return nil
	}
	err := os.RemoveAll(p)
	if err == nil {
		return nil
	}
	_ = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("gitws: %w", err)
	}
	return nil
}

// keyedLocks are mutexes by key whose waits end with a context. An entry lives while someone
// holds or waits for it.
type keyedLocks struct {
	mu sync.Mutex
	m  map[string]*keyedLock
}

type keyedLock struct {
	ch   chan struct{} // holds a token while locked
	refs int           // holders and waiters
}

// held reports whether someone holds key's lock now.
func (k *keyedLocks) held(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.m[key]
	return l != nil && len(l.ch) > 0
}

// lock takes key's lock, or returns ctx's error if ctx ends first; unlock releases it.
func (k *keyedLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyedLock{ch: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, context.Cause(ctx)
	}
}

// flights are the fetches in progress, by key. A caller that wants a fetch already in progress
// waits for it rather than running its own, but only as long as its own context lets it; one
// whose context ended keeps nobody waiting past theirs.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
	// waiting, if set (by tests), is called when a caller starts waiting for another's fetch.
	waiting func(key string)
}

type flight struct {
	done chan struct{}
	err  error
	// abandoned is set when the fetch was ended by its caller's context (a turn's timeout or
	// cancel): its error is no answer for the others waiting, who run it again.
	abandoned bool
}

// do runs fn as the fetch of key, or waits for the one in progress and returns its error. ctx
// is the caller's: fn must run under it.
func (f *flights) do(ctx context.Context, key string, fn func() error) error {
	for {
		f.mu.Lock()
		if f.m == nil {
			f.m = map[string]*flight{}
		}
		fl := f.m[key]
		if fl == nil {
			fl = &flight{done: make(chan struct{})}
			f.m[key] = fl
			f.mu.Unlock()
			err := fn()
			f.mu.Lock()
			delete(f.m, key)
			fl.err, fl.abandoned = err, ctx.Err() != nil
			close(fl.done)
			f.mu.Unlock()
			return err
		}
		f.mu.Unlock()
		if f.waiting != nil {
			f.waiting(key)
		}
		select {
		case <-fl.done:
			if !fl.abandoned {
				return fl.err
			}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}
