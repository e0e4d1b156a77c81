package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/httpapi"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/sqlitestore"
	"github.com/agenthost/agenthost/transport"
)

// manager is a started Manager on the public store and transport (no
// agent starts: the tests send no message).
func manager(t *testing.T) *room.Manager {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "agenthost.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := transport.NewRPC(transport.Options{Custodian: cust})
	if err != nil {
		t.Fatal(err)
	}
	m, err := room.New(room.Options{Store: st, Transport: tr, Root: filepath.Join(dir, "rooms")})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := errors.Join(m.Close(), m.Wait(context.Background()), cust.Close(), st.Close())
		if err != nil {
			t.Error(err)
		}
	})
	return m
}

func get(t *testing.T, h http.Handler, path string, header ...string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

func TestNewRefuses(t *testing.T) {
	if _, err := httpapi.New(httpapi.Options{Token: "x"}); err == nil {
		t.Error("no Manager: no error")
	}
	if _, err := httpapi.New(httpapi.Options{Manager: manager(t)}); err == nil {
		t.Error("neither Token nor Authorize: no error (the API would be open to anyone)")
	}
}

// TestToken: a hostile caller without the token, with a wrong one, with
// it in another scheme or in the query gets 401 and a JSON error on every
// protected route; /healthz stays open.
func TestToken(t *testing.T) {
	h, err := httpapi.New(httpapi.Options{Manager: manager(t), Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, path := range []string{"/v1/rooms", "/v1/rooms/r", "/v1/openapi.json", "/metrics", "/v1/rooms/r/events?follow=0"} {
		for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"Authorization", "Basic czNjcmV0"},
			{"Authorization", "Bearer s3cret2"}, {"Authorization", "s3cret"}} {
			code, body := get(t, h, path, hdr...)
			var e struct{ Error string }
			if code != http.StatusUnauthorized || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("GET %s with %v: %d %s, want 401 with a JSON error", path, hdr, code, body)
			}
		}
		q := path + "?token=s3cret"
		if strings.Contains(path, "?") {
			q = path + "&token=s3cret"
		}
		if code, _ := get(t, h, q); code != http.StatusUnauthorized {
			t.Errorf("GET %s (the token in the query): %d, want 401", q, code)
		}
	}
	if code, body := get(t, h, "/v1/rooms", "Authorization", "Bearer s3cret"); code != http.StatusOK {
		t.Errorf("GET /v1/rooms with the token: %d %s", code, body)
	}
	if code, body := get(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz without a token: %d %s", code, body)
	}
}

// TestAuthorize: Authorize replaces the token (a bearer token alone no
// longer passes), sees every protected request and none of the open
// ones, and may be called from racing requests.
func TestAuthorize(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	h, err := httpapi.New(httpapi.Options{Manager: manager(t), Token: "s3cret", Authorize: func(r *http.Request) bool {
		mu.Lock()
		seen[r.URL.Path]++
		mu.Unlock()
		return r.Header.Get("X-User") == "ann"
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	mux := http.NewServeMux()
	mux.Handle("/agents/", http.StripPrefix("/agents", h))
	if code, _ := get(t, mux, "/agents/v1/rooms", "Authorization", "Bearer s3cret"); code != http.StatusUnauthorized {
		t.Errorf("the token alone under Authorize: %d, want 401", code)
	}
	if code, _ := get(t, mux, "/agents/v1/rooms", "X-User", "bob"); code != http.StatusUnauthorized {
		t.Errorf("a user Authorize refuses: %d, want 401", code)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if code, body := get(t, mux, "/agents/v1/rooms", "X-User", "ann"); code != http.StatusOK {
				t.Errorf("a user Authorize accepts: %d %s", code, body)
			}
		})
	}
	wg.Wait()
	if code, _ := get(t, mux, "/agents/healthz"); code != http.StatusOK {
		t.Errorf("/healthz under Authorize: %d", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen["/v1/rooms"] != 10 || seen["/healthz"] != 0 {
		t.Errorf("Authorize saw %v, want /v1/rooms 10 times and /healthz never", seen)
	}
}
