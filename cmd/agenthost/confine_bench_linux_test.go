package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/agenthost/agenthost/internal/confine"
)

// BenchmarkConfinedAgentStart is what confinement adds to every agent
// start: /bin/true run directly, and through the launcher of a binary that
// links everything agenthost does (this test binary, as agenthost's own
// launcher is agenthost). The launcher runs from its package's init, so
// the packages initialised after it (the store, NATS, metrics, rooms) cost
// it nothing. As root, confined-own-uid is an agent run as a uid of its
// own whose folders lie under folders that uid cannot search.
func BenchmarkConfinedAgentStart(b *testing.B) {
	if confine.KernelABI() < 1 {
		b.Skip("this kernel has no Landlock")
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	c, err := confine.New(confine.Options{Mode: confine.ModeLandlock, Exe: exe})
	if err != nil {
		b.Fatal(err)
	}
	p, err := c.Policy(confine.AgentRoom(b.TempDir(), b.TempDir(), []string{"true"}, nil))
	if err != nil {
		b.Fatal(err)
	}
	variants := []struct {
		name string
		p    *confine.Policy
	}{{"direct", nil}, {"confined", p}}
	// As root: the agent as a uid of its own, its folders under 0700
	// folders (b.TempDir's), so the launcher also builds its view of them.
	if os.Geteuid() == 0 {
		u := &confine.User{UID: 3999010, GID: 3999010}
		ws, home := b.TempDir(), filepath.Join(b.TempDir(), "home")
		if err := os.Mkdir(home, 0o700); err != nil {
			b.Fatal(err)
		}
		for _, d := range []string{ws, home} {
			if err := os.Chown(d, u.UID, u.GID); err != nil {
				b.Fatal(err)
			}
		}
		r := confine.AgentRoom(ws, home, []string{"true"}, nil)
		r.User = u
		up, err := c.Policy(r)
		if err != nil {
			b.Fatal(err)
		}
		variants = append(variants, struct {
			name string
			p    *confine.Policy
		}{"confined-own-uid", up})
	}
	for _, v := range variants {
		argv, env := []string{"/bin/true"}, os.Environ()
		if v.p != nil {
			if argv, env, err = v.p.Wrap(argv, env); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(v.name, func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command(argv[0], argv[1:]...)
				cmd.Env = env
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%v: %s", err, out)
				}
			}
		})
	}
}
