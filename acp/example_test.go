package acp_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/agenthost/agenthost/acp"
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/modeltest"
	"github.com/agenthost/agenthost/transport"
)

// omp as an ACP agent ("omp acp") on the built-in scripted model: start
// it in custody, open a session, prompt, and close it with its receipt.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	model, err := modeltest.Start(ctx, modeltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer model.Close()
	dir, err := os.MkdirTemp("", "acp-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	workspace := filepath.Join(dir, "workspace")
	if err := os.Mkdir(workspace, 0o700); err != nil {
		log.Fatal(err)
	}

	// The installed omp (make setup), and its home pointed at the model.
	r, err := transport.ACPCommand(transport.Options{ModelURL: model.URL()}, "omp", filepath.Join(dir, "home"))
	if err != nil {
		log.Fatal(err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer cust.Close()
	c, err := acp.Start(ctx, acp.Spec{Argv: r.Argv, Dir: workspace, Env: r.Env}, acp.Options{Custodian: cust, SessionMeta: r.SessionMeta})
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.NewSession(ctx, workspace, nil)
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Prompt(ctx, s.ID, "hello")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.StopReason, res.Text)

	// Close ends the agent and everything it started; Wait joins the
	// client's callbacks.
	receipt, err := c.Close(ctx)
	if err != nil {
		log.Fatal(err)
	}
	_ = c.Wait(ctx)
	left := 0
	for _, p := range receipt.Processes {
		if p.Ended == custody.EndedUnknown {
			left++
		}
	}
	fmt.Println("processes in the receipt:", len(receipt.Processes) > 0, "left running:", left)
	// Output:
	// end_turn ok: hello
	// processes in the receipt: true left running: 0
}
