package snapshot

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchFiles is the workspace size the issue sets the goal for.
const benchFiles = 10_000

// benchWorkspace writes 10,000 source-like files (100 directories of 100
// files of 40 lines, about 1.3 KB each).
func benchWorkspace(b *testing.B) string {
	b.Helper()
	ws := b.TempDir()
	var body strings.Builder
	for i := range 40 {
		fmt.Fprintf(&body, "\tline %d of a source file, long enough to look like code;\n", i)
	}
	for d := range benchFiles / 100 {
		dir := filepath.Join(ws, fmt.Sprintf("pkg%03d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 100 {
			content := fmt.Sprintf("// file %d/%d\n%s", d, f, body.String())
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("file%03d.go", f)), []byte(content), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	return ws
}

// gitCPU reports, beside the wall time, the CPU time git used per
// operation: on a loaded machine the wall time mostly measures the wait
// for a core.
func gitCPU(b *testing.B) func() {
	start := childCPU()
	return func() {
		b.ReportMetric(float64((childCPU()-start).Microseconds())/1000/float64(b.N), "git-cpu-ms/op")
	}
}

func benchRepo(b *testing.B, ws string) *Repo {
	b.Helper()
	r, err := Open(context.Background(), filepath.Join(b.TempDir(), "snapshots"), ws, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Close() })
	return r
}

// turn edits three files, and adds one or deletes the one added before:
// what an agent's small turn does. *seq numbers the turns of one
// workspace across the benchmark's runs, so no turn writes what an
// earlier one wrote.
func turn(b *testing.B, ws string, seq *int) {
	*seq++
	i := *seq
	b.Helper()
	for k := range 3 {
		p := filepath.Join(ws, fmt.Sprintf("pkg%03d/file%03d.go", (i*7+k*31)%100, (i*13+k)%100))
		f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := fmt.Fprintf(f, "// edit %d\n", i); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
	added := filepath.Join(ws, "pkg000", "added.go")
	if _, err := os.Stat(added); err != nil {
		if err := os.WriteFile(added, []byte(fmt.Sprintf("// added %d\n", i)), 0o644); err != nil {
			b.Fatal(err)
		}
	} else if err := os.Remove(added); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSnapshot measures snapshots of a 10,000-file workspace: the
// first (every file read and stored), one after a small turn (the goal:
// under 200 ms), and one of an unchanged workspace.
func BenchmarkSnapshot(b *testing.B) {
	ctx := context.Background()
	ws := benchWorkspace(b)
	seq := 0
	b.Run("first", func(b *testing.B) {
		defer gitCPU(b)()
		for range b.N {
			b.StopTimer()
			r := benchRepo(b, ws)
			b.StartTimer()
			if _, _, err := r.Snapshot(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("after-small-turn", func(b *testing.B) {
		r := benchRepo(b, ws)
		if _, _, err := r.Snapshot(ctx); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		defer gitCPU(b)()
		for range b.N {
			b.StopTimer()
			turn(b, ws, &seq)
			b.StartTimer()
			_, rep, err := r.Snapshot(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if rep.Updated < 4 {
				b.Fatalf("read %d paths, want at least the turn's 4", rep.Updated)
			}
		}
	})
	b.Run("unchanged", func(b *testing.B) {
		r := benchRepo(b, ws)
		if _, _, err := r.Snapshot(ctx); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		defer gitCPU(b)()
		for range b.N {
			if _, _, err := r.Snapshot(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDiff measures Changes and Diff between the snapshots around a
// small turn in a 10,000-file workspace, and a Restore undoing it.
func BenchmarkDiff(b *testing.B) {
	ctx := context.Background()
	ws := benchWorkspace(b)
	r := benchRepo(b, ws)
	before, _, err := r.Snapshot(ctx)
	if err != nil {
		b.Fatal(err)
	}
	seq := 0
	turn(b, ws, &seq)
	after, _, err := r.Snapshot(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("changes", func(b *testing.B) {
		defer gitCPU(b)()
		for range b.N {
			if c, err := r.Changes(ctx, before, after); err != nil || c.Files != 4 {
				b.Fatal(c, err)
			}
		}
	})
	b.Run("diff", func(b *testing.B) {
		defer gitCPU(b)()
		for range b.N {
			if d, err := r.Diff(ctx, before, after, Limits{}); err != nil || len(d.Files) != 4 {
				b.Fatal(d.Files, err)
			}
		}
	})
	at := after
	b.Run("restore", func(b *testing.B) {
		defer gitCPU(b)()
		for range b.N {
			to := before
			if at == before {
				to = after
			}
			at = to
			if res, err := r.Restore(ctx, to); err != nil || len(res.Paths) != 4 {
				b.Fatal(res, err)
			}
		}
	})
}
