package main

import (
	"os"
	"os/exec"
	"testing"

	"github.com/agenthost/agenthost/internal/confine"
)

// BenchmarkConfinedAgentStart is what confinement adds to every agent
// start: /bin/true run directly, and through the launcher of a binary that
// links everything agenthost does (this test binary, as agenthost's own
// launcher is agenthost). The launcher runs from its package's init, so
// the packages initialised after it (the store, NATS, metrics, rooms) cost
// it nothing.
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
	for _, confined := range []bool{false, true} {
		argv, env := []string{"/bin/true"}, os.Environ()
		if confined {
			if argv, env, err = p.Wrap(argv, env); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(map[bool]string{false: "direct", true: "confined"}[confined], func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command(argv[0], argv[1:]...)
				cmd.Env = env
				if err := cmd.Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
