package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/room"
)

// TestFail_ClusterErrors: what a cluster's rooms answer maps to the
// statuses docs/http.md gives (issue 48): a room no node holds is 404
// (it was 500), and a message whose log did not answer is 503 saying it
// may have been stored (a client told 500 posts again blindly).
func TestFail_ClusterErrors(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	for _, c := range []struct {
		err    error
		status int
		body   string
	}{
		{fmt.Errorf("%w: %q", room.ErrNotHeld, "idle"), http.StatusNotFound, "approval a_1: not found"},
		{fmt.Errorf("%w: the cluster's log did not take the message (a leader election?); the message may have been stored: %w", room.ErrUnavailable, errors.New("nats: timeout")),
			http.StatusServiceUnavailable, "may have been stored"},
	} {
		w := httptest.NewRecorder()
		s.fail(w, httptest.NewRequest("POST", "/v1/rooms/idle/approvals/a_1", nil), c.err, "approval a_1")
		if w.Code != c.status || !strings.Contains(w.Body.String(), c.body) {
			t.Errorf("%v: %d %s; want %d saying %q", c.err, w.Code, w.Body, c.status, c.body)
		}
	}
}
