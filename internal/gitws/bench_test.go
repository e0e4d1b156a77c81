package gitws_test

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/agenthost/agenthost/internal/gitws"
)

// benchFiles is the size of the benchmark's repository: 2000 files of 1 KiB (incompressible, so
// the history's size is real) in 100 folders.
const benchFiles = 2000

// bigRepo builds a repository with benchFiles files on main.
func bigRepo(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	git(b, dir, "init", "--quiet", "--initial-branch=main")
	rnd := rand.New(rand.NewPCG(1, 2))
	body := make([]byte, 1024)
	for i := range benchFiles {
		for j := range body {
			body[j] = byte(rnd.IntN(256))
		}
		writeFile(b, filepath.Join(dir, fmt.Sprintf("d%02d", i%100), fmt.Sprintf("f%04d.bin", i)), string(body))
	}
	git(b, dir, "add", ".")
	git(b, dir, "commit", "--quiet", "-m", "many files")
	return "file://" + dir
}

// BenchmarkEngine_PrepareSecondRoom is a room's Prepare on a repository another room already
// uses: a fetch that finds nothing new, then the checkout of the files. Each iteration's room is
// removed again outside the timer.
func BenchmarkEngine_PrepareSecondRoom(b *testing.B) {
	url := bigRepo(b)
	e := newEngine(b, gitws.Options{})
	ctx := context.Background()
	spec := gitws.Spec{Git: url, Ref: "main"}
	if _, err := e.Prepare(ctx, "first", spec); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var gitBytes int64
	for i := range b.N {
		room := fmt.Sprint("room-", i)
		ready, err := e.Prepare(ctx, room, spec)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		gitBytes = duBytes(b, filepath.Join(ready.Dir, ".git"))
		if err := e.Remove(ctx, room); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(benchFiles, "files")
	b.ReportMetric(float64(gitBytes), "gitdir-bytes")
}

// duBytes sums the sizes of the files under dir.
func duBytes(b *testing.B, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		n += fi.Size()
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkEngine_PrepareFirstRoom is the first room's Prepare: the mirror made and fetched,
// then the checkout.
func BenchmarkEngine_PrepareFirstRoom(b *testing.B) {
	url := bigRepo(b)
	ctx := context.Background()
	spec := gitws.Spec{Git: url, Ref: "main"}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		e := newEngine(b, gitws.Options{})
		b.StartTimer()
		if _, err := e.Prepare(ctx, "first", spec); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(benchFiles, "files")
}

// BenchmarkGitClone is the baseline: a plain `git clone` of the same repository.
func BenchmarkGitClone(b *testing.B) {
	url := bigRepo(b)
	b.ResetTimer()
	var gitBytes int64
	for range b.N {
		b.StopTimer()
		dst := filepath.Join(b.TempDir(), "clone")
		b.StartTimer()
		cmd := exec.Command("git", "clone", "--quiet", url, dst)
		cmd.Env = append(cmd.Environ(), fixtureEnv...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("git clone: %v: %s", err, out)
		}
		b.StopTimer()
		gitBytes = duBytes(b, filepath.Join(dst, ".git"))
		b.StartTimer()
	}
	b.ReportMetric(benchFiles, "files")
	b.ReportMetric(float64(gitBytes), "gitdir-bytes")
}
