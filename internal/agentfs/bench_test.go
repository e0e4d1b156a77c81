//go:build unix

package agentfs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// What agentfs costs over the os calls it replaces, for the files the
// server writes into a home at every agent start (three folders deep).
func BenchmarkWriteFile(b *testing.B) {
	d, err := Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	data := make([]byte, 1<<10)
	for b.Loop() {
		if err := d.WriteFile(".omp/agent/models.yml", data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

// The os calls the home's writers made before agentfs (following links).
func BenchmarkOSWriteFile(b *testing.B) {
	dir := b.TempDir()
	data := make([]byte, 1<<10)
	for b.Loop() {
		p := filepath.Join(dir, ".omp", "agent", "models.yml")
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

// Glob and ReadFile of a session file among 100 (a room's resume).
func BenchmarkGlobRead(b *testing.B) {
	dir := b.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sessions"), 0o700); err != nil {
		b.Fatal(err)
	}
	for i := range 100 {
		if err := os.WriteFile(filepath.Join(dir, "sessions", fmt.Sprintf("%03d_s%d.jsonl", i, i)), make([]byte, 4<<10), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	d, err := Open(dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	for b.Loop() {
		m, err := d.Glob("sessions/*_s42.jsonl")
		if err != nil || len(m) != 1 {
			b.Fatal(m, err)
		}
		if _, err := d.ReadFile(m[0], 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}

// OwnTree of a workspace of 10,000 files in 100 folders (once per room,
// when its uid is allocated).
func BenchmarkOwnTree(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("giving files to another user needs root")
	}
	dir := b.TempDir()
	for i := range 100 {
		sub := filepath.Join(dir, fmt.Sprintf("d%d", i))
		if err := os.Mkdir(sub, 0o700); err != nil {
			b.Fatal(err)
		}
		for j := range 100 {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%d", j)), nil, 0o600); err != nil {
				b.Fatal(err)
			}
		}
	}
	for b.Loop() {
		if _, err := OwnTree(dir, Owner{UID: 4242, GID: 4242}); err != nil {
			b.Fatal(err)
		}
	}
}
