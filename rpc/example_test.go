package rpc_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/agenthost/agenthost/modeltest"
	"github.com/agenthost/agenthost/rpc"
	"github.com/agenthost/agenthost/transport"
)

// omp in RPC mode on the built-in scripted model: spawn it, run a turn,
// print its answer, and close it (the process stopped and reaped).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	model, err := modeltest.Start(ctx, modeltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer model.Close()
	dir, err := os.MkdirTemp("", "rpc-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// The installed agents (make setup; AGENTHOST_TOOLS names their folder
	// outside an agenthost checkout), and a home for omp that points it
	// at the model.
	omp, err := transport.RPCCommand(transport.Options{ModelURL: model.URL()}, "omp", filepath.Join(dir, "home"))
	if err != nil {
		log.Fatal(err)
	}
	workspace := filepath.Join(dir, "workspace")
	if err := os.Mkdir(workspace, 0o700); err != nil {
		log.Fatal(err)
	}
	c, err := rpc.Spawn(ctx, rpc.Spec{Argv: omp.Argv, Model: omp.Model, Dir: workspace, Env: omp.Env,
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
