package client_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/room"
)

// TestClientContract: New reads AGENTHOST_URL and AGENTHOST_TOKEN as the
// agenthost command does and names itself in User-Agent; Turns lists a
// room's turns with their outcome, text and usage; Messages and Turns
// clamp their limit to the largest page; a receipt is a custody.Receipt;
// a room's budget nil keeps the server's default and zeros lift it.
func TestClientContract(t *testing.T) {
	api := newAPI(t, room.Options{Budget: room.Budget{Turns: 1}})
	var mu sync.Mutex
	agents := map[string]bool{}
	api.fault = func(w http.ResponseWriter, r *http.Request, serve http.Handler) bool {
		mu.Lock()
		agents[r.Header.Get("User-Agent")] = true
		mu.Unlock()
		return false
	}
	t.Setenv(client.EnvURL, api.URL())
	t.Setenv(client.EnvToken, testToken)
	c, err := client.New("", client.Options{UserAgent: "contract-test/1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := c.SetConfig(ctx, "r", client.RoomConfig{}); err != nil {
		t.Fatal(err)
	}
	acc, err := c.Send(ctx, "r", client.NewMessage{Text: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, "r", acc); err != nil {
		t.Fatal(err)
	}
	turns, err := c.Turns(ctx, "r", 0, 5000)
	if err != nil || len(turns) != 1 || turns[0].MessageID != acc.ID || turns[0].Outcome != client.OutcomeSettled ||
		turns[0].Text != "ok: hello" || turns[0].Usage == nil || turns[0].Ended == nil {
		t.Fatalf("turns: %+v %v", turns, err)
	}
	if later, err := c.Turns(ctx, "r", acc.Seq, 0); err != nil || len(later) != 0 {
		t.Fatalf("turns after the message: %+v %v", later, err)
	}
	if msgs, err := c.Messages(ctx, "r", 0, 5000); err != nil || len(msgs) != 1 {
		t.Fatalf("messages with a limit over the largest page: %+v %v", msgs, err)
	}
	// The server's default budget (one turn) holds for a room whose
	// settings leave the budget out; zeros lift it.
	if _, err := c.Send(ctx, "r", client.NewMessage{Text: "more"}); !errors.Is(err, client.ErrBudgetExhausted) {
		t.Fatalf("over the default budget: %v", err)
	}
	if cfg, err := c.SetConfig(ctx, "r", client.RoomConfig{Budget: &client.Budget{}}); err != nil || *cfg.Budget != (client.Budget{}) {
		t.Fatalf("no limit: %+v %v", cfg.Budget, err)
	}
	acc, err = c.Send(ctx, "r", client.NewMessage{Text: "more"})
	if err != nil {
		t.Fatalf("after lifting the budget: %v", err)
	}
	if _, err := c.Wait(ctx, "r", acc); err != nil {
		t.Fatal(err)
	}
	rel, err := c.Release(ctx, "r")
	if err != nil || !rel.Released || rel.Receipt == nil {
		t.Fatalf("release: %+v %v", rel, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(agents) != 1 || !agents["contract-test/1 "+client.UserAgent] {
		t.Fatalf("User-Agent headers: %v", agents)
	}
}

// TestNewNeedsAnAddressAndToken: without them, New says where to give
// them.
func TestNewNeedsAnAddressAndToken(t *testing.T) {
	t.Setenv(client.EnvURL, "")
	t.Setenv(client.EnvToken, "")
	if _, err := client.New("", client.Options{Token: "x"}); err == nil || !strings.Contains(err.Error(), "AGENTHOST_URL") {
		t.Fatalf("no address: %v", err)
	}
	if _, err := client.New("http://127.0.0.1:1", client.Options{}); err == nil || !strings.Contains(err.Error(), "AGENTHOST_TOKEN") {
		t.Fatalf("no token: %v", err)
	}
}

// TestRoomConfinement: a room's confinement decodes (the server sends it
// when its transport says).
func TestRoomConfinement(t *testing.T) {
	var r client.Room
	raw := `{"id":"r","resident":true,"turn":null,"queued":0,"last_seq":3,"approvals":[],"questions":[],"node":"",
		"confinement":{"mode":"landlock","abi":7,"signals":true,"net":[443]},"turns":0,"usage":{},"usage_by_sender":{}}`
	if err := json.Unmarshal([]byte(raw), &r); err != nil || r.Confinement == nil || r.Confinement.Mode != "landlock" || r.Confinement.ABI != 7 {
		t.Fatalf("%+v %v", r.Confinement, err)
	}
	var rel client.Released
	raw = `{"released":true,"seq":3,"reason":"released on request","receipt":{"scope":"s1","containment":"cgroup-v2","processes":[{"pid":7,"cmdline":"omp"}],"duration":5,"duration_seconds":5e-9}}`
	if err := json.Unmarshal([]byte(raw), &rel); err != nil || rel.Receipt == nil || rel.Receipt.Scope != "s1" || len(rel.Receipt.Processes) != 1 ||
		rel.Receipt.Processes[0].PID != 7 {
		t.Fatalf("a receipt: %+v %v", rel.Receipt, err)
	}
	if !errors.Is(&client.APIError{StatusCode: http.StatusNotImplemented}, client.ErrNotSupported) {
		t.Fatal("501 is not ErrNotSupported")
	}
}

// TestClientTokens: the admin creates, lists and revokes room tokens; a
// room token's client reaches its room, is ErrForbidden elsewhere and
// ErrUnauthorized once revoked.
func TestClientTokens(t *testing.T) {
	api := newAPI(t, room.Options{})
	admin, err := client.New(api.URL(), client.Options{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	tok, err := admin.CreateToken(ctx, client.NewToken{Rooms: []string{"mine"}, Can: []string{client.CanRead, client.CanSend},
		ExpiresIn: time.Hour, Label: "ann"})
	if err != nil || tok.Secret == "" || tok.ID == "" || tok.Label != "ann" || tok.Expires.Sub(tok.Created) != time.Hour {
		t.Fatalf("create: %+v %v", tok, err)
	}
	list, err := admin.Tokens(ctx)
	if err != nil || len(list) != 1 || list[0].ID != tok.ID || list[0].Secret != "" || list[0].Revoked != nil {
		t.Fatalf("tokens: %+v %v", list, err)
	}
	c, err := client.New(api.URL(), client.Options{Token: tok.Secret})
	if err != nil {
		t.Fatal(err)
	}
	acc, err := c.Send(ctx, "mine", client.NewMessage{Text: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, "mine", acc); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(ctx, "theirs", client.NewMessage{Text: "hello"}); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("send to another room: %v", err)
	}
	if _, err := c.CreateToken(ctx, client.NewToken{Rooms: []string{"*"}, Can: []string{client.CanRead}}); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("a room token created a token: %v", err)
	}
	if err := admin.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if err := admin.RevokeToken(ctx, "tok_none"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
	if _, err := c.Room(ctx, "mine"); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("a revoked token: %v", err)
	}
}
