package acpagent

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/room"
)

// peerHeld is what the fake peer's "work" keeps (so that it is held
// until the peer ends).
var peerHeld [][]byte

// peerLimitPrompt plays the limits' prompts in the fake peer (its answer,
// and whether text was one):
//   - "work": holds 64 MiB (each page touched), uses at least 0.5 s of CPU
//     and answers with its own CPU time (user+system, in seconds);
//   - "eat memory": allocates 4 GiB, each page touched (a room's memory
//     limit kills it first), and answers "survived" if it was not.
func peerLimitPrompt(text string) (string, bool) {
	touch := func(n int) {
		for range n {
			b := make([]byte, 8<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			peerHeld = append(peerHeld, b)
		}
	}
	cpu := func() float64 {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	switch text {
	case "work":
		touch(8)
		x := 0
		for start := cpu(); cpu()-start < 0.5; {
			for i := range 100000 {
				x += i
			}
		}
		return fmt.Sprintf("cpu %.3f %d", cpu(), x%2), true
	case "eat memory":
		touch(512)
		return "survived", true
	}
	return "", false
}

// An ACP agent starts under its room's limits and is metered: agent.started
// and the room's state say how they hold, a turn's compute is what the
// agent used (its own CPU time within 10%, the memory it held), and an
// agent that allocates past the memory limit is killed there: its turn
// fails naming the limit, room.limit says the agent was killed, and the
// next message starts it again.
func TestLimitsAndComputeOfAnACPAgent(t *testing.T) {
	c, err := custody.New(custody.Options{Resources: true, NoSubreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	s := c.Support()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !s.Enforced() {
		t.Skipf("limits are not enforced by cgroups here: %s", s.Why)
	}
	limits := room.Limits{Memory: 256 << 20, Pids: 64, CPU: 1}
	h := roomtest.StartCustody(t, "", nil, room.Options{Config: room.Config{
		Command: []string{os.Args[0], "-test.run=^$"}, Env: []string{fakePeerEnv + "=1"}, Limits: limits,
	}}, custody.Options{Resources: true}, func(cust *custody.Custodian, in *agents.Install, url string) (room.Transport, error) {
		return New(Options{Custodian: cust, Install: in, ModelURL: url})
	})
	a1 := h.Submit("r", "work")
	d := h.Ended("r", a1)
	var agentCPU float64
	text, _ := d["text"].(string)
	if _, err := fmt.Sscanf(text, "cpu %g", &agentCPU); err != nil || d["outcome"] != room.OutcomeSettled {
		t.Fatalf("the working turn: %v", d)
	}
	comp, _ := d["compute"].(map[string]any)
	if comp == nil {
		t.Fatalf("no compute on turn.ended: %v", d)
	}
	// The turn's CPU is the agent's since the turn began: all but its
	// start (the agent was started for this turn; its start is a small
	// part of it).
	cpu, _ := comp["cpu_seconds"].(float64)
	peak, _ := comp["peak_memory_bytes"].(float64)
	t.Logf("compute %v; the agent's own CPU time %.3f s", comp, agentCPU)
	if cpu < 0.5*0.9 || cpu > agentCPU*1.1 {
		t.Errorf("cpu_seconds %.3f, the agent's own CPU time %.3f s", cpu, agentCPU)
	}
	if peak < 64<<20 || peak > float64(limits.Memory) {
		t.Errorf("peak_memory_bytes %.0f: the agent held 64 MiB under a limit of 256 MiB", peak)
	}
	var res *event.Resources
	for _, ev := range h.Events("r") {
		if ev.Type == event.TypeAgentStarted {
			var as event.AgentStarted
			if err := json.Unmarshal(ev.Data, &as); err != nil {
				t.Fatal(err)
			}
			res = as.Resources
		}
	}
	if res == nil || !res.Enforced || res.Memory != 256<<20 || res.Pids != 64 || res.CPU != 1 || res.By.Memory != string(s.Memory) {
		t.Fatalf("agent.started's resources: %+v", res)
	}

	a2 := h.Submit("r", "eat memory")
	d = h.Ended("r", a2)
	if reason, _ := d["reason"].(string); d["outcome"] != room.OutcomeFailed || !strings.Contains(reason, "killed at the room's memory limit (256 MiB)") {
		t.Fatalf("the turn of the agent that allocated 4 GiB: %v", d)
	}
	var killed bool
	for _, ev := range h.Events("r") {
		if ev.Type == event.TypeRoomLimit {
			var rl event.RoomLimit
			if err := json.Unmarshal(ev.Data, &rl); err != nil {
				t.Fatal(err)
			}
			killed = killed || rl.Limit == event.LimitMemory && rl.AgentKilled && rl.Value == 256<<20 && rl.Count >= 1
		}
	}
	if !killed {
		t.Fatalf("no room.limit of the agent killed at the memory limit: %v", h.Events("r"))
	}
	a3 := h.Submit("r", "hello again")
	if got := h.Settled("r", a3); got != "after" {
		t.Fatalf("the next turn: %q", got)
	}
}
