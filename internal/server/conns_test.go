package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/room"
)

// serveReal serves the harness's Server as agenthost serve does (its
// HTTPServer on its Listener) on a loopback port and returns the address.
func serveReal(t *testing.T, h *harness) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := h.s.HTTPServer(nil)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(h.s.Listener(ln)) }()
	t.Cleanup(func() {
		h.s.Close() // the streams first, as serve does
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// rawGet sends one GET on c without a token and reads its response.
func rawGet(t *testing.T, c net.Conn, br *bufio.Reader, path string) *http.Response {
	t.Helper()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}

// waitClosed reads c until the server closes it; it fails after within.
func waitClosed(t *testing.T, c net.Conn, within time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(within))
	var b [1]byte
	n, err := c.Read(b[:])
	if n > 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("connection not closed by the server: read %d bytes, %v", n, err)
	}
}

// TestIdleConnectionsAreClosed: connections without a token that sent a
// request and went quiet, or sent nothing at all, are closed by the
// server (IdleTimeout, ReadHeaderTimeout); a request refused for its
// token closes its connection at once.
func TestIdleConnectionsAreClosed(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{IdleTimeout: 300 * time.Millisecond, ReadHeaderTimeout: 300 * time.Millisecond})
	addr := serveReal(t, h)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var idle, silent, refused []net.Conn
	for range 20 {
		c := dial()
		if res := rawGet(t, c, bufio.NewReader(c), "/healthz"); res.StatusCode != http.StatusOK || res.Close {
			t.Fatalf("healthz: %d, close %v", res.StatusCode, res.Close)
		}
		idle = append(idle, c)
		silent = append(silent, dial())
		c = dial()
		if res := rawGet(t, c, bufio.NewReader(c), "/v1/rooms"); res.StatusCode != http.StatusUnauthorized || !res.Close {
			t.Fatalf("without a token: %d, close %v", res.StatusCode, res.Close)
		}
		refused = append(refused, c)
	}
	// Bounded waits: the server closes each well within them.
	for _, cs := range [][]net.Conn{refused, idle, silent} {
		for _, c := range cs {
			waitClosed(t, c, 30*time.Second)
		}
	}
}

// TestConnectionTimeoutsDoNotCutStreams: an event stream outlasts the idle
// and header timeouts many times over and still gets the room's events.
func TestConnectionTimeoutsDoNotCutStreams(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{IdleTimeout: 100 * time.Millisecond, ReadHeaderTimeout: 100 * time.Millisecond,
		BodyTimeout: 100 * time.Millisecond, Heartbeat: time.Hour})
	addr := serveReal(t, h)
	h.ended("s", h.post("s", "first"))
	st, err := h.m.State(t.Context(), "s")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://%s/v1/rooms/s/events?after=%d", addr, st.LastSeq), nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	// The point: the stream stays idle past every connection timeout.
	time.Sleep(time.Second)
	acc := h.post("s", "second")
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"message_id":"`+acc.ID+`"`) {
			return
		}
	}
	t.Fatalf("the stream ended before the new message's events: %v", sc.Err())
}

// TestConnectionsAreBounded: past MaxConns the server accepts a new
// connection only once one closes.
func TestConnectionsAreBounded(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{MaxConns: 2})
	addr := serveReal(t, h)
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rawGet(t, c, bufio.NewReader(c), "/healthz")
		held = append(held, c)
	}
	third, err := net.Dial("tcp", addr) // the kernel's backlog takes it
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if _, err := fmt.Fprintf(third, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// Not served while two are open (a wait that can only pass on a
	// slow machine, never fail on one).
	_ = third.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var b [1]byte
	if n, err := third.Read(b[:]); n > 0 || err == nil {
		t.Fatalf("a third connection was served past the bound: %d bytes, %v", n, err)
	}
	held[0].Close()
	_ = third.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(third), nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("the third connection once one closed: %v, %v", res, err)
	}
	res.Body.Close()
}

// TestSlowBodyIsRefused: a body that does not arrive within BodyTimeout
// gets 408 and frees its connection.
func TestSlowBodyIsRefused(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{BodyTimeout: 200 * time.Millisecond})
	addr := serveReal(t, h)
	if code, err := slowBody(addr, "/v1/rooms/b/messages"); code != http.StatusRequestTimeout {
		t.Fatalf("slow body: %d, %v", code, err)
	}
}

// slowBody posts to path a body that stops half way and returns the
// status.
func slowBody(addr, path string) (int, error) { return slowBodyWith(addr, "POST", path) }

// slowBodyWith is slowBody with the request's method.
func slowBodyWith(addr, method, path string) (int, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\":", method, path, testToken)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}
