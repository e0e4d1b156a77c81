package deptest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoGoroutineIdentity: no production code tells goroutines apart by
// parsing runtime.Stack (Go has no goroutine identity by design). Close
// is safe from callbacks because it never waits on them, not because it
// recognises them (README, "Callbacks and shutdown"). Stack dumps in
// tests, for diagnosis, are fine.
func TestNoGoroutineIdentity(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "runtime.Stack(") {
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s calls runtime.Stack outside a test", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
