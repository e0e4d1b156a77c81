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
		_ = closeAndWait(t, c)
		aw.Close()
		ar.Close()
		wg.Wait()
	})
	if err := c.Start(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	return c, write
}

// Event.Start of the frame after a skipped line (over the cap, or a first
// frame refused as no JSON object) is where that frame begins, not where
// the skipped line began: a room resumes an undecided dialog from Start,
// and would read the skipped line again.
func TestClient_StartAfterSkippedLine(t *testing.T) {
	long := `{"type":"notice","pad":"` + strings.Repeat("x", 200) + `"}`
	for _, tc := range []struct {
		name    string
		skipped string
	}{{"over the cap", long}, {"refused first frame", "not json"}, {"none", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			const base = 1000
			p := newPipePeer(t, Options{MaxLineBytes: 100, Adopt: &Adopt{Offset: base}})
			got := make(chan Event, 4)
			p.c.On("notice", func(ev Event) { got <- ev })
			b := `{"type":"notice","n":2}`
			want := int64(base)
			if tc.skipped != "" {
				p.say(tc.skipped)
				want += int64(len(tc.skipped) + 1)
			}
			p.say(b)
			ev := <-got
			if ev.Start() != want || ev.End() != want+int64(len(b)+1) {
				t.Fatalf("frame after the skipped line: [%d,%d), want [%d,%d)", ev.Start(), ev.End(), want, want+int64(len(b)+1))
			}
		})
	}
}

// An adopted client decides its assumed run at get_state's answer in
// stream order: a run the agent starts right after that answer (omp
// finishing a background job) is not folded into the adopted turn. Idle
// answer: the adopted turn ends with AgentInvoked false, and the run is a
// turn of its own with its text. With the previous client's prompt (or
// abort_and_prompt) acknowledged after the offset, the run is the adopted
// turn's. (The answer was acted on by the handshake goroutine after the
// reader had read on, and the run's text belonged to no turn.)
func TestClient_AdoptDecidesAtTheAnswerInStreamOrder(t *testing.T) {
	for _, tc := range []struct {
		name, ack string
	}{
		{"idle", ""},
		{"prompt acknowledged after the offset", `{"type":"response","id":"ah-3","command":"prompt","success":true}`},
		{"abort_and_prompt acknowledged after the offset", `{"type":"response","id":"ah-3","command":"abort_and_prompt","success":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 20 {
				adoptAnswerThenRun(t, i, tc.ack, false)
			}
		})
	}
	t.Run("NoHandshake, idle", func(t *testing.T) {
		for i := range 20 {
			adoptAnswerThenRun(t, i, "", true)
		}
	})
}

func adoptAnswerThenRun(t *testing.T, i int, ack string, noHandshake bool) {
	cr, aw := io.Pipe()
	ar, cw := io.Pipe()
	ends := make(chan struct{}, 1)
	c := New(cr, cw, Options{NoHandshake: noHandshake, Adopt: &Adopt{Offset: 42, RunOpen: true, Ready: true},
		OnEvent: func(ev Event) {
			if ev.Type == EventAgentEnd {
				ends <- struct{}{}
			}
		}})
	var wmu sync.Mutex
	write := func(s string) {
		wmu.Lock()
		defer wmu.Unlock()
		_, _ = io.WriteString(aw, s)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if ack != "" {
			write(ack + "\n")
		}
		sc := bufio.NewScanner(ar)
		first := true
		for sc.Scan() {
			var cmd map[string]any
			if json.Unmarshal(sc.Bytes(), &cmd) != nil {
				continue
			}
			b, _ := json.Marshal(map[string]any{"type": "response", "id": cmd["id"], "command": cmd["type"], "success": true,
				"data": map[string]any{"isStreaming": false, "sessionId": "s1"}})
			out := string(b) + "\n"
			if first {
				// The agent starts a run right after its idle answer, in
				// the same write.
				out += `{"type":"agent_start"}` + "\n" +
					`{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"he"}}` + "\n"
				first = false
			}
			write(out)
		}
	}()
	defer func() {
		aw.Close() // the agent's output ends first: Close need not cut it
		_ = closeAndWait(t, c)
		ar.Close()
		wg.Wait()
	}()
	if err := c.Start(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if noHandshake {
		if _, err := c.GetState(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"hello"}],"stopReason":"stop"}}` + "\n" +
		`{"type":"agent_end","messages":[]}` + "\n")
	select {
	case <-ends:
	case <-time.After(10 * time.Second):
		t.Fatalf("iteration %d: agent_end not delivered", i)
	}
	if err := c.Sync(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	adopted, cur := c.adopted, c.turn
	c.mu.Unlock()
	for _, tt := range []*turnState{adopted, cur} {
		select {
		case <-tt.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: a turn did not end", i)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	a, r := adopted.result, cur.result
	if ack != "" {
		if cur != adopted || a.Text != "hello" || !a.AgentInvoked {
			t.Fatalf("iteration %d: the acknowledged prompt's run should be the adopted turn's: adopted text %q invoked %v, current is adopted %v",
				i, a.Text, a.AgentInvoked, cur == adopted)
		}
		return
	}
	if a.AgentInvoked || len(a.Events) != 0 {
		t.Fatalf("iteration %d: adopted turn: invoked %v, %d events; want it ended at the idle answer, empty", i, a.AgentInvoked, len(a.Events))
	}
	if cur == adopted || r.Text != "hello" || !r.Unsolicited {
		t.Fatalf("iteration %d: the run after the idle answer is in no turn of its own (current turn text %q)", i, r.Text)
	}
}
