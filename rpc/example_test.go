package rpc_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/rpc"
)

// omp in RPC mode on the built-in scripted model: spawn it, run a turn,
// print its answer, and close it (the process stopped and reaped).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer sim.Close()
	dir, err := os.MkdirTemp("", "rpc-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// The installed agents (make setup) and a home for omp that points it
	// at the model.
	in, err := agents.Find()
	if err != nil {
		log.Fatal(err)
	}
	argv, err := in.Argv(agents.OMP)
	if err != nil {
		log.Fatal(err)
	}
	env, err := agents.Home(filepath.Join(dir, "home"), agents.OMP, sim.URL())
	if err != nil {
		log.Fatal(err)
	}
	workspace := filepath.Join(dir, "workspace")
	if err := os.Mkdir(workspace, 0o700); err != nil {
		log.Fatal(err)
	}
	c, err := rpc.Spawn(ctx, rpc.Spec{Argv: argv, Model: agents.ModelID, Dir: workspace, Env: env,
		SessionDir: filepath.Join(dir, "sessions")}, rpc.SpawnOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		// Close stops the agent; Wait joins the client's callbacks.
		_ = c.Close()
		_ = c.Wait(ctx)
	}()

	turn, err := c.Run(ctx, "hello", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(turn.Text)
	// Output: ok: hello
}
