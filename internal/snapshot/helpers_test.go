package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCtx bounds a test's calls, so a hang fails the test instead of
// stalling the run.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// openRepo opens a Repo on ws with its shadow repository in a fresh
// directory, closed when the test ends.
func openRepo(t *testing.T, ws string, opts Options) *Repo {
	t.Helper()
	r, err := Open(testCtx(t), filepath.Join(t.TempDir(), "snapshots"), ws, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func snap(t *testing.T, r *Repo) (ID, Report) {
	t.Helper()
	id, rep, err := r.Snapshot(testCtx(t))
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return id, rep
}

// write creates or replaces the file rel in ws (and its directories).
func write(t *testing.T, ws, rel, content string) {
	t.Helper()
	p := filepath.Join(ws, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, ws, rel, target string) {
	t.Helper()
	p := filepath.Join(ws, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func remove(t *testing.T, ws, rel string) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(ws, filepath.FromSlash(rel))); err != nil {
		t.Fatal(err)
	}
}

// state describes every entry under dir (but a top-level .git unless
// withGit): "dir", "file 0644 <content>", "file 0755 ...", "link <target>".
func state(t *testing.T, dir string, withGit bool) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if rel == ".git" && !withGit {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			m[rel] = "link " + target
		case fi.IsDir():
			m[rel] = "dir"
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			mode := "0644"
			if fi.Mode()&0o100 != 0 {
				mode = "0755"
			}
			if len(b) > 256 {
				sum := sha256.Sum256(b)
				m[rel] = "file " + mode + " sha256:" + hex.EncodeToString(sum[:])
			} else {
				m[rel] = "file " + mode + " " + string(b)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// fingerprint is every byte and mode under dir, .git included, with
// modification times: what "untouched" means for a repository.
func fingerprint(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := state(t, dir, true)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		m[filepath.ToSlash(rel)+" (meta)"] = fi.Mode().String() + " " + fi.ModTime().UTC().Format(time.RFC3339Nano)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func sameState(t *testing.T, what string, want, got map[string]string) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("%s (-want +got):\n%s", what, d)
	}
}

// treeOf lists a snapshot's recorded paths with their git modes.
func treeOf(t *testing.T, r *Repo, id ID) map[string]string {
	t.Helper()
	out, err := r.output(testCtx(t), nil, "ls-tree", "-r", "-z", string(id))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, rec := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		if rec == "" {
			continue
		}
		meta, path, _ := strings.Cut(rec, "\t")
		m[path] = strings.Fields(meta)[0]
	}
	return m
}

// blobOf is the bytes a snapshot recorded for path.
func blobOf(t *testing.T, r *Repo, id ID, path string) string {
	t.Helper()
	out, err := r.output(testCtx(t), nil, "cat-file", "blob", string(id)+":"+path)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// userGit runs git as a user would in dir, with a private config, for
// building the workspaces under test.
func userGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL="+os.DevNull,
		"GIT_AUTHOR_NAME=user", "GIT_AUTHOR_EMAIL=user@example.com",
		"GIT_COMMITTER_NAME=user", "GIT_COMMITTER_EMAIL=user@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}
