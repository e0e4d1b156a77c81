package custody_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"os/exec"
	"strings"
	"time"

	"github.com/agenthost/agenthost/custody"
)

// A command that leaves a process of its own behind, in a session of its
// own, as agents' tools do: the scope finds it, and Close ends it and says
// so in the receipt.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := custody.New(custody.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The script says "started" once its child runs sleep.
	script := `setsid sleep 300 & until grep -q '^sleep' /proc/$!/cmdline; do sleep 0.05; done; echo started; wait`
	s, err := c.Start(ctx, exec.Command("sh", "-c", script))
	if err != nil {
		log.Fatal(err)
	}
	out := bufio.NewScanner(s.Stdout())
	out.Scan()
	fmt.Println(out.Text())

	r, err := s.Close(ctx)
	if err != nil {
		log.Fatal(err)
	}
	detached, allEnded := false, true
	for _, e := range r.Processes {
		detached = detached || strings.HasPrefix(e.Cmdline, "sleep 300")
		allEnded = allEnded && e.Ended != custody.EndedUnknown
	}
	fmt.Println("the detached sleep was in custody:", detached)
	fmt.Println("every process ended:", allEnded)
	// Output:
	// started
	// the detached sleep was in custody: true
	// every process ended: true
}
