package agents_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
)

func TestACPRecipe_OMP(t *testing.T) {
	in := &agents.Install{Dir: fakeTools(t)}
	home := filepath.Join(t.TempDir(), "home")
	r, err := in.ACP(agents.OMP, agents.ACPOptions{Home: home, ModelURL: "http://127.0.0.1:9/v1", Yolo: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(r.Argv); n < 4 || r.Argv[n-3] != "acp" || r.Argv[n-2] != "--approval-mode" || r.Argv[n-1] != "yolo" {
		t.Fatalf("argv %q", r.Argv)
	}
	if r.Model != agents.ModelID || !slices.Contains(r.Env, "HOME="+home) {
		t.Fatalf("model %q env has HOME: %v", r.Model, slices.Contains(r.Env, "HOME="+home))
	}
	if _, err := os.Stat(filepath.Join(home, ".omp", "agent", "models.yml")); err != nil {
		t.Fatalf("the home does not point at the model: %v", err)
	}
	r, err = in.ACP(agents.OMP, agents.ACPOptions{Home: home})
	if err != nil || r.Argv[len(r.Argv)-1] != "acp" || r.Model != "" {
		t.Fatalf("without a model URL or yolo: %+v %v", r, err)
	}
}

func TestACPRecipe_Unknown(t *testing.T) {
	in := &agents.Install{Dir: fakeTools(t)}
	if _, err := in.ACP("nope", agents.ACPOptions{Home: t.TempDir()}); !errors.Is(err, agents.ErrNoRecipe) {
		t.Fatalf("err %v", err)
	}
}
