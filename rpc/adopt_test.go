package rpc

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// A client adopting an agent mid-run: events carry their end position in
// the agent's stdout counted from the adopted offset, and the run whose
// agent_start lies before that offset ends at its agent_end as a turn.
func TestClient_AdoptMidRun(t *testing.T) {
	const base = 1000
	frames := []string{
		`{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"lo"}}`,
		`{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"hello"}],"stopReason":"stop"}}`,
		`{"type":"agent_end","messages":[]}`,
	}
	p := newPipePeer(t, Options{Adopt: &Adopt{Offset: base, RunOpen: true}})
	var mu sync.Mutex
	var ends []int64
	p.c.On("", func(ev Event) {
		mu.Lock()
		ends = append(ends, ev.End())
		mu.Unlock()
	})
	p.say(frames...)
	turn, err := p.c.WaitTurn(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !turn.Unsolicited || turn.Text != "hello" || !turn.AgentInvoked {
		t.Fatalf("turn: unsolicited %v, text %q, invoked %v", turn.Unsolicited, turn.Text, turn.AgentInvoked)
	}
	if err := p.c.Sync(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	want, at := []int64{}, int64(base)
	for _, f := range frames {
		at += int64(len(f)) + 1
		want = append(want, at)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ends) != len(want) {
		t.Fatalf("ends %v, want %v", ends, want)
	}
	for i := range want {
		if ends[i] != want[i] {
			t.Fatalf("ends %v, want %v", ends, want)
		}
	}
}

// An adopted client whose agent turns out idle (the run ended before the
// adopted offset, or never began) does not wait for an agent_end that
// will never come: the handshake's get_state, read in order with the
// events, settles the assumed run.
func TestClient_AdoptIdleSettles(t *testing.T) {
	c, _ := startIdlePeer(t, &Adopt{Offset: 42, RunOpen: true})
	turn, err := c.WaitTurn(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if turn.AgentInvoked {
		t.Fatal("an idle adopted agent's assumed run should end with AgentInvoked false")
	}
}

// Replies to the previous client's requests, read again from the agent's
// output, are dropped quietly by an adopted client; a client that read
// from the start reports such a reply.
func TestClient_AdoptDropsThePreviousClientsReplies(t *testing.T) {
	for _, adopt := range []*Adopt{{Offset: 10}, nil} {
		p := newPipePeer(t, Options{Adopt: adopt})
		seen := make(chan struct{})
		p.c.On("notice", func(Event) { close(seen) })
		p.say(`{"type":"response","id":"ah-7","command":"get_state","success":true,"data":{}}`,
			`{"type":"notice","message":"after"}`)
		select {
		case <-seen:
		case <-time.After(10 * time.Second):
			t.Fatal("the frame after the reply was not read")
		}
		errs := p.c.Errors()
		if adopt != nil && len(errs) != 0 {
			t.Fatalf("adopted: errors %v, want none", errs)
		}
		if adopt == nil && (len(errs) != 1 || !strings.Contains(errs[0].Error(), "unknown request")) {
			t.Fatalf("not adopted: errors %v, want the unknown reply", errs)
		}
	}
}

// Sync after WaitTurn covers the frame that ended the turn: the turn is
// settled only once that frame is queued for the listeners. (It was
// settled first, so a Sync could pass before the listeners saw agent_end.)
func TestClient_SyncAfterWaitTurnSeesTheEndingFrame(t *testing.T) {
	for i := range 1000 {
		p := newPipePeer(t, Options{Adopt: &Adopt{RunOpen: true}})
		seen := make(chan string, 4)
		p.c.On("", func(ev Event) { seen <- ev.Type })
		p.say(`{"type":"agent_end","messages":[]}`)
		if _, err := p.c.WaitTurn(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := p.c.Sync(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		select {
		case typ := <-seen:
			if typ != EventAgentEnd {
				t.Fatalf("run %d: listener saw %q", i, typ)
			}
		default:
			t.Fatalf("run %d: Sync returned before the listeners saw the agent_end that ended the turn", i)
		}
	}
}

// A restart between a prompt's acknowledgement and its run's agent_start:
// the adopted client reads the previous client's acknowledgement after
// its offset, then get_state's idle answer (omp says idle while it
// prepares a run). The turn is not ended there: it waits for the run and
// ends at its agent_end, with its text (it ended empty before, and the run
// came as another turn). For an agent without ready (pi) whose prompt
// starts no run, the no-run poll ends it.
func TestClient_AdoptBetweenAckAndRun(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ready bool
		run   bool
	}{{"omp run follows", true, true}, {"pi run follows", false, true}, {"pi no run", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			// The previous client's prompt was acknowledged after the offset.
			c, write := startIdlePeer(t, &Adopt{Offset: 42, RunOpen: true, Ready: tc.ready},
				`{"type":"response","id":"ah-3","command":"prompt","success":true}`)
			c.mu.Lock()
			adopted := c.turn
			c.mu.Unlock()
			if tc.run {
				write(`{"type":"agent_start"}`,
					`{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"hello"}],"stopReason":"stop"}}`,
					`{"type":"agent_end","messages":[]}`)
			}
			turn, err := c.WaitTurn(ctxT(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			c.mu.Lock()
			res := adopted.result
			c.mu.Unlock()
			if tc.run && (res.Text != "hello" || !res.AgentInvoked || turn.Text != "hello") {
				t.Fatalf("adopted turn: text %q, invoked %v; want the run's text", res.Text, res.AgentInvoked)
			}
			if !tc.run && turn.AgentInvoked {
				t.Fatal("a prompt that started no run: the turn should end with AgentInvoked false")
			}
		})
	}
}

// startIdlePeer starts an adopted client on a fake agent that first writes
// lines, then answers every request as an idle agent (checking that the
// client's ids cannot collide with its predecessor's). write adds frames
// to the agent's output.
func startIdlePeer(t *testing.T, adopt *Adopt, lines ...string) (c *Client, write func(lines ...string)) {
	t.Helper()
	cr, aw := io.Pipe()
	ar, cw := io.Pipe()
	c = New(cr, cw, Options{Adopt: adopt})
	var wmu sync.Mutex
	write = func(lines ...string) {
		wmu.Lock()
		defer wmu.Unlock()
		for _, l := range lines {
			_, _ = aw.Write([]byte(l + "\n"))
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		write(lines...)
		sc := bufio.NewScanner(ar)
		for sc.Scan() {
			var cmd map[string]any
			if json.Unmarshal(sc.Bytes(), &cmd) != nil {
				continue
			}
			id, _ := cmd["id"].(string)
			if !strings.HasPrefix(id, "ah") || strings.HasPrefix(id, "ah-") {
				t.Errorf("an adopted client's request id %q may collide with the previous client's", id)
			}
			b, _ := json.Marshal(map[string]any{"type": "response", "id": id, "command": cmd["type"], "success": true,
				"data": map[string]any{"isStreaming": false, "sessionId": "s1"}})
			write(string(b))
		}
	}()
	t.Cleanup(func() {
		c.Close()
		aw.Close()
		ar.Close()
		wg.Wait()
	})
	if err := c.Start(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	return c, write
}
