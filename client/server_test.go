package client_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/roomfake"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/server"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

const testToken = "client-test-token-0123456789"

// apiServer is agenthost's HTTP API (internal/server) over rooms on a
// store in dir, with roomfake's agents, served on 127.0.0.1. It can be
// stopped and started again on the same address and store, as a server
// restart.
type apiServer struct {
	dir  string
	ropt room.Options
	addr string // set by the first start

	mu sync.Mutex
	// lastEventIDs are the Last-Event-ID headers of the event requests.
	lastEventIDs []string
	// fault, if set, sees each request first and handles it instead of
	// the server when it returns true (serve is the server).
	fault func(w http.ResponseWriter, r *http.Request, serve http.Handler) bool

	db   *store.DB
	toks *store.Tokens
	m    *room.Manager
	s    *server.Server
	ts   *httptest.Server
}

// startAPI starts an apiServer in dir (a fresh one when dir is "").
func startAPI(ctx context.Context, dir string, ropt room.Options) (*apiServer, error) {
	a := &apiServer{dir: dir, ropt: ropt}
	return a, a.start(ctx)
}

func (a *apiServer) start(ctx context.Context) error {
	db, err := store.Open(ctx, filepath.Join(a.dir, "agenthost.db"), store.Options{})
	if err != nil {
		return err
	}
	toks, err := store.OpenTokens(ctx, filepath.Join(a.dir, "tokens.db"))
	if err != nil {
		db.Close()
		return err
	}
	ropt := a.ropt
	ropt.Store, ropt.Transport, ropt.Root = roomsqlite.New(db), roomfake.New(), filepath.Join(a.dir, "rooms")
	m, err := room.New(ropt)
	if err != nil {
		toks.Close()
		db.Close()
		return err
	}
	if err := m.Start(ctx); err != nil {
		toks.Close()
		db.Close()
		return err
	}
	s, err := server.New(server.Options{Manager: m, Token: testToken, Tokens: toks})
	if err != nil {
		closeRooms(m)
		toks.Close()
		db.Close()
		return err
	}
	addr := a.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.Close()
		closeRooms(m)
		toks.Close()
		db.Close()
		return err
	}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		if filepath.Base(r.URL.Path) == "events" {
			a.lastEventIDs = append(a.lastEventIDs, r.Header.Get("Last-Event-ID"))
		}
		fault := a.fault
		a.mu.Unlock()
		if fault != nil && fault(w, r, s) {
			return
		}
		s.ServeHTTP(w, r)
	}))
	ts.Listener = ln
	ts.Start()
	a.addr = ln.Addr().String()
	a.db, a.toks, a.m, a.s, a.ts = db, toks, m, s, ts
	return nil
}

// closeRooms closes m and waits for its end: the store closes after.
func closeRooms(m *room.Manager) {
	_ = m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = m.Wait(ctx)
}

func (a *apiServer) URL() string { return "http://" + a.addr }

// stop ends the streams, the listener and the rooms, as a server's
// shutdown does.
func (a *apiServer) stop() {
	if a.ts == nil {
		return
	}
	a.s.Close()
	a.ts.CloseClientConnections()
	a.ts.Close()
	closeRooms(a.m)
	_ = a.toks.Close()
	_ = a.db.Close()
	a.ts = nil
}

func (a *apiServer) eventIDs() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.lastEventIDs...)
}

// newAPI starts an apiServer for a test, stopped at its end.
func newAPI(t *testing.T, ropt room.Options) *apiServer {
	t.Helper()
	a, err := startAPI(t.Context(), t.TempDir(), ropt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.stop)
	return a
}
