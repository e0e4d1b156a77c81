package natsroom

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/room"
)

// Regression tests for issue 48 (review-cluster): what a request answers
// when no node runs its room, or its node is cut off.

// TestCluster_ControlInARoomNoNodeHolds: approving or answering in a room
// no node holds is settled from its log (an unknown id 404, a decided one
// 409) and a cancel finds no turn: it was 500 (ErrNotHeld unmapped).
func TestCluster_ControlInARoomNoNodeHolds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true, idleAfter: 200 * time.Millisecond})
	defer h.stop()
	h.run(ctx)
	rm := "idle"
	w, err := h.c.lease.Watch(ctx, token(rm), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	acc, err := h.m.Submit(ctx, rm, room.Message{Text: "approve:bash"})
	if err != nil {
		t.Fatal(err)
	}
	e := waitEvent(ctx, t, h, rm, 0, "approval.requested", nil)
	var req struct {
		ID string `json:"approval_id"`
	}
	_ = json.Unmarshal(e.Data, &req)
	if err := h.m.Approve(ctx, rm, req.ID, true); err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	// Idle: its agent released, its lease given up.
	for given := false; !given; {
		select {
		case <-ctx.Done():
			t.Fatal("the idle room's lease was not given up")
		case e := <-w.Updates():
			given = e != nil && e.Operation() == jetstream.KeyValueDelete
		}
	}
	if n := h.c.Holder(ctx, rm); n != "" {
		t.Fatalf("room held by %q", n)
	}
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"approve an unknown id", h.m.Approve(ctx, rm, "a_nope", true), room.ErrNotFound},
		{"approve a decided one", h.m.Approve(ctx, rm, req.ID, false), room.ErrConflict},
		{"answer an unknown id", h.m.Answer(ctx, rm, "q_nope", "x"), room.ErrNotFound},
		{"cancel", h.m.Cancel(ctx, rm), room.ErrNoTurn},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s in a room no node holds: %v; want %v", c.name, c.err, c.want)
		}
	}
}

// stubJS is a JetStream whose publishes fail with the errors given, one
// per attempt (the last again), and which counts them.
type stubJS struct {
	jetstream.JetStream
	mu    sync.Mutex
	errs  []error
	calls int
}

func (s *stubJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.errs[min(s.calls, len(s.errs)-1)]
	s.calls++
	return nil, err
}

// TestPublishInbox_EveryFailureIs503SayingWhetherItMayHaveLanded: a POST
// whose inbox publish JetStream answers "a publish with this id is in
// process" (10158: after a partition heals, for a message sent through the
// cut-off node) is retried under the same id and, still unanswered, is
// room.ErrUnavailable saying the message may have been stored (503, as
// docs/http.md promises); it was a plain error (500). A refusal for want of
// storage says nothing was stored.
func TestPublishInbox_EveryFailureIs503SayingWhetherItMayHaveLanded(t *testing.T) {
	inProcess := &jetstream.APIError{Code: 409, ErrorCode: jsErrDuplicateInProcess, Description: "duplicate message id is in process"}
	full := &jetstream.APIError{Code: 503, ErrorCode: 10047, Description: "insufficient storage resources available"}
	other := &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
	for _, c := range []struct {
		name  string
		errs  []error
		want  string
		calls int
	}{
		{"in process", []error{context.DeadlineExceeded, inProcess}, "may have been stored", inboxAttempts},
		{"in process from the first", []error{inProcess}, "may have been stored", inboxAttempts},
		{"no leader", []error{jetstream.ErrNoStreamResponse}, "nothing was stored", inboxAttempts},
		{"storage full", []error{full}, "nothing was stored", 1},
		{"timeout then refused", []error{context.DeadlineExceeded, other}, "may have been stored", 2},
		{"refused", []error{other}, "nothing was stored", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			js := &stubJS{errs: c.errs}
			cl := &Cluster{js: js, log: discardLogger()}
			err := cl.publishInbox(context.Background(), "r", "m_1", []byte(`{}`))
			if !errors.Is(err, room.ErrUnavailable) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("publishInbox: %v; want room.ErrUnavailable saying %q", err, c.want)
			}
			if js.calls != c.calls {
				t.Fatalf("%d attempts, want %d", js.calls, c.calls)
			}
		})
	}
}
