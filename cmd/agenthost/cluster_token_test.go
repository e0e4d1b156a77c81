package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stop ends the node with SIGTERM and waits for it (killing it after 30 s).
func (n *serveNode) stop(t *testing.T) {
	t.Helper()
	if n.done {
		return
	}
	n.done = true
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	ch := make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		_ = n.cmd.Process.Kill()
		<-ch
		t.Errorf("%s did not stop within 30 s of SIGTERM", n.name)
	}
}

// clusterToken is a token's creation answer.
type clusterToken struct {
	ID, Token string
}

func createToken(t *testing.T, n *serveNode, auth, body string) clusterToken {
	t.Helper()
	code, b := call(t, "POST", n.url+"v1/tokens", auth, body)
	var tok clusterToken
	if code != http.StatusCreated || json.Unmarshal(b, &tok) != nil || tok.Token == "" || tok.ID == "" {
		t.Fatalf("token through %s: %d %s", n.name, code, b)
	}
	return tok
}

// openStream opens room rm's event stream through n with tok and reads
// its first line: the stream is open.
func openStream(t *testing.T, ctx context.Context, n *serveNode, tok, rm string) *bufio.Reader {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", n.url+"v1/rooms/"+rm+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Body.Close() })
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("stream through %s: %d %s", n.name, res.StatusCode, b)
	}
	br := bufio.NewReader(res.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("stream through %s: %v", n.name, err)
	}
	return br
}

// drainUntilEnd reads the stream until it ends; an error other than its
// end (the test's deadline) fails.
func drainUntilEnd(t *testing.T, br *bufio.Reader, what string) {
	t.Helper()
	for {
		if _, err := br.ReadString('\n'); err != nil {
			if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "unexpected EOF") {
				t.Fatalf("%s: the stream did not end: %v", what, err)
			}
			return
		}
	}
}

// In a cluster, room tokens are the cluster's (issue 43): a token created
// through n1 works through n2 and n3; revoked through n2, its open stream
// on n1 ends and it is refused through every node; a room token cannot
// create, list or revoke tokens through another node; a revocation through
// n3 of a token n1 created a moment ago is a revocation, not a 404; and
// the tokens survive a restart of the whole cluster (the revoked ones
// stay revoked).
func TestServe_NATSClusterTokens(t *testing.T) {
	if os.Getenv("AGENTHOST_CLUSTER_TESTS") == "" {
		t.Skip("set AGENTHOST_CLUSTER_TESTS=1 (make test does) to run the cluster process tests")
	}
	admin := "cluster-test-token"
	data := t.TempDir()
	var cports [3]int
	for i := range cports {
		cports[i] = freeTCPPort(t)
	}
	nodes := startServeClusterAt(t, data, cports, admin, false, [3]string{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if code, body := call(t, "POST", nodes[0].url+"v1/rooms/r/messages", admin, `{"text":"hello"}`); code != http.StatusAccepted {
		t.Fatalf("post: %d %s", code, body)
	}

	// The room is known through every node once its holder wrote its
	// log (a GET meanwhile is 404).
	for _, n := range nodes {
		for {
			code, body := call(t, "GET", n.url+"v1/rooms/r", admin, "")
			if code == 200 {
				break
			}
			if code != http.StatusNotFound || ctx.Err() != nil {
				t.Fatalf("room r through %s: %d %s", n.name, code, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	reader := createToken(t, nodes[0], admin, `{"rooms":["r"],"can":["read"],"label":"n1's reader"}`)
	keep := createToken(t, nodes[0], admin, `{"rooms":["r"],"can":["read"],"label":"kept"}`)
	// Through every node, as soon as the node's feed has it (a few ms):
	// a 401 meanwhile is tried again.
	for _, n := range nodes {
		for {
			code, body := call(t, "GET", n.url+"v1/rooms/r", reader.Token, "")
			if code == 200 {
				break
			}
			if code != http.StatusUnauthorized || ctx.Err() != nil {
				t.Fatalf("n1's token through %s: %d %s", n.name, code, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// Its scope holds on every node.
		if code, body := call(t, "GET", n.url+"v1/rooms/other", reader.Token, ""); code != http.StatusForbidden {
			t.Fatalf("n1's token in another room through %s: %d %s", n.name, code, body)
		}
	}

	// A room token with every permission in every room cannot make,
	// widen, list or revoke tokens through another node.
	wide := createToken(t, nodes[0], admin, `{"rooms":["*"],"can":["read","send","approve","configure","release","purge"],"label":"wide"}`)
	for _, n := range nodes[1:] {
		for {
			code, _ := call(t, "GET", n.url+"v1/token", wide.Token, "")
			if code == 200 {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("the wide token never reached %s", n.name)
			}
			time.Sleep(20 * time.Millisecond)
		}
		for _, c := range []struct{ method, path, body string }{
			{"POST", "v1/tokens", `{"rooms":["*"],"can":["read"]}`},
			{"GET", "v1/tokens", ""},
			{"DELETE", "v1/tokens/" + reader.ID, ""},
			{"DELETE", "v1/tokens/" + wide.ID, ""},
		} {
			if code, body := call(t, c.method, n.url+c.path, wide.Token, c.body); code != http.StatusForbidden {
				t.Fatalf("a room token's %s %s through %s: %d %s", c.method, c.path, n.name, code, body)
			}
		}
	}

	// Revoked through n2: the stream open on n1 ends, and the token is
	// refused through every node.
	br := openStream(t, ctx, nodes[0], reader.Token, "r")
	start := time.Now()
	if code, body := call(t, "DELETE", nodes[1].url+"v1/tokens/"+reader.ID, admin, ""); code != 200 {
		t.Fatalf("revoke through n2: %d %s", code, body)
	}
	drainUntilEnd(t, br, "n1's stream of the token revoked through n2")
	t.Logf("the stream on n1 ended %s after the revocation through n2", time.Since(start))
	for _, n := range nodes {
		if code, body := call(t, "GET", n.url+"v1/rooms/r", reader.Token, ""); code != http.StatusUnauthorized || !strings.Contains(string(body), "revoked") {
			t.Fatalf("the revoked token through %s: %d %s", n.name, code, body)
		}
	}

	// Created through n1 and revoked at once through n3 (two racing
	// admins): n3 revokes it even if its feed has not brought it yet.
	quick := createToken(t, nodes[0], admin, `{"rooms":["r"],"can":["read"],"label":"quick"}`)
	if code, body := call(t, "DELETE", nodes[2].url+"v1/tokens/"+quick.ID, admin, ""); code != 200 {
		t.Fatalf("revoke through n3 of a token made through n1: %d %s", code, body)
	}
	if code, body := call(t, "DELETE", nodes[2].url+"v1/tokens/tok_none", admin, ""); code != http.StatusNotFound {
		t.Fatalf("revoke of an unknown token: %d %s", code, body)
	}
	for _, n := range nodes {
		for {
			code, body := call(t, "GET", n.url+"v1/rooms/r", quick.Token, "")
			if code == http.StatusUnauthorized && strings.Contains(string(body), "revoked") {
				break
			}
			if (code != 200 && code != http.StatusUnauthorized) || ctx.Err() != nil {
				t.Fatalf("the quick token through %s: %d %s", n.name, code, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// The whole cluster stops and starts again.
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.stop(t) }()
	}
	wg.Wait()
	nodes = startServeClusterAt(t, data, cports, admin, false, [3]string{})
	for _, n := range nodes {
		if code, body := call(t, "GET", n.url+"v1/rooms/r", keep.Token, ""); code != 200 {
			t.Fatalf("a token after the cluster's restart, through %s: %d %s", n.name, code, body)
		}
		for _, gone := range []clusterToken{reader, quick} {
			if code, body := call(t, "GET", n.url+"v1/rooms/r", gone.Token, ""); code != http.StatusUnauthorized {
				t.Fatalf("a revoked token after the restart, through %s: %d %s", n.name, code, body)
			}
		}
		code, body := call(t, "GET", n.url+"v1/tokens", admin, "")
		var list struct{ Tokens []struct{ ID string } }
		if code != 200 || json.Unmarshal(body, &list) != nil || len(list.Tokens) != 4 {
			t.Fatalf("the tokens through %s after the restart: %d %s", n.name, code, body)
		}
	}
	// No secret in a file of the shared data dir (the NATS stores
	// included): only hashes are replicated.
	err := filepath.WalkDir(data, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, tok := range []clusterToken{reader, keep, wide, quick} {
			if strings.Contains(string(b), tok.Token[len("aht_"):]) {
				t.Errorf("the secret of %s is in %s", tok.ID, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
