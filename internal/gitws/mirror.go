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
	"time"
)

// mirrorConfig is the whole config of every mirror. The engine writes it before each use, so
// nothing written into a mirror's config by anyone else (a room's agent, without confinement)
// stays in effect: no filters, hooks, fsmonitor or alternates but the engine's.
const mirrorConfig = `[core]
	repositoryformatversion = 0
	filemode = true
	bare = true
[gc]
	auto = 0
[maintenance]
	auto = false
`

func (e *Engine) mirrorDir(key string) string {
	return filepath.Join(e.opts.Root, "mirrors", key+".git")
}

// sync brings the repository's mirror up to date as far as ref needs and resolves ref to a
// commit; it returns the mirror's folder, the commit and the ref's kind. One sync per mirror
// runs at a time; a sync that waited for another's fetch, begun after it was called, does not
// fetch again.
func (e *Engine) sync(ctx context.Context, rm remote, ref string) (mirror, commit, kind string, err error) {
	called := time.Now()
	unlock, err := e.mirrors.lock(ctx, rm.key)
	if err != nil {
		return "", "", "", err
	}
	defer unlock()
	mirror = e.mirrorDir(rm.key)
	if err := e.ensureMirror(ctx, mirror); err != nil {
		return "", "", "", err
	}
	// A commit the mirror already has never changes: no fetch.
	if hexRef.MatchString(ref) {
		if c, err := e.resolve(ctx, mirror, ref); err != nil || c != "" {
			return mirror, c, KindCommit, err
		}
	}
	e.mu.Lock()
	fresh := e.fetched[rm.key].After(called)
	e.mu.Unlock()
	if !fresh {
		started := time.Now()
		_, err := e.run(ctx, call{op: "fetch", remote: &rm, args: []string{"--git-dir=" + mirror,
			"fetch", "--quiet", "--prune", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head",
			"--", rm.raw, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"}})
		if err != nil {
			return "", "", "", unreachable(err)
		}
		e.mu.Lock()
		e.fetched[rm.key] = started
		e.mu.Unlock()
	}
	for _, k := range []struct{ prefix, kind string }{{"refs/heads/", KindBranch}, {"refs/tags/", KindTag}} {
		c, err := e.resolve(ctx, mirror, k.prefix+ref)
		if err != nil || c != "" {
			return mirror, c, k.kind, err
		}
	}
	if !hexRef.MatchString(ref) {
		return "", "", "", fmt.Errorf("%w: %s has no branch or tag %q", ErrUnknownRef, rm.redacted, ref)
	}
	// A commit no branch or tag reaches: servers that allow it send it when asked by its full id.
	if len(ref) == 40 || len(ref) == 64 {
		if _, err := e.run(ctx, call{op: "fetch", remote: &rm, args: []string{"--git-dir=" + mirror,
			"fetch", "--quiet", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head", "--", rm.raw, ref}}); err != nil {
			if ctx.Err() != nil {
				return "", "", "", err
			}
			e.log.Debug("gitws: fetch by commit id refused", "url", rm.redacted, "err", err)
		}
		if c, err := e.resolve(ctx, mirror, ref); err != nil || c != "" {
			return mirror, c, KindCommit, err
		}
	}
	return "", "", "", fmt.Errorf("%w: %s has no branch, tag or commit %q", ErrUnknownRef, rm.redacted, ref)
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
		if _, err := e.run(ctx, call{op: "init", args: []string{"init", "--quiet", "--bare", "--template=", tmp}}); err != nil {
			os.RemoveAll(tmp)
			return err
		}
		if err := os.Rename(tmp, mirror); err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("gitws: %w", err)
		}
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
	_, err := e.run(ctx, call{op: "checkout", args: []string{"--git-dir=" + gitDir, "--work-tree=" + dir,
		"checkout", "--quiet", "--detach", commit, "--"}})
	return err
}

// pruneMirror deletes the mirror when no room's record names it.
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
	e.mu.Lock()
	delete(e.fetched, key)
	e.mu.Unlock()
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
