//go:build unix

package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// The store, its WAL, shared memory and lock are the server's alone
// (0600), whatever the umask: a new store, and an older one whose files
// another process left readable (the data dir made 0755 by a chmod is
// then no way in).
func TestStoreFilesArePrivate(t *testing.T) {
	for _, older := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "agenthost.db")
		if older {
			for _, p := range []string{path, path + "-wal"} {
				if err := os.WriteFile(p, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(p, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		db, err := Open(context.Background(), path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		err = db.Write(context.Background(), func(w *Writer) error {
			_, err := w.Append("r", "message.accepted", map[string]string{"message_id": "m"})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{path, path + "-wal", path + "-shm", path + ".lock"} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatalf("older %v: %v", older, err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("older %v: %s is %v", older, filepath.Base(p), fi.Mode().Perm())
			}
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
