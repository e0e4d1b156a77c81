package main

import (
	"encoding/json"
	"net/http"
	"os"
	"testing"
)

// In a cluster room tokens are not replicated (issue 43): a token works
// through the node that created it and is unknown (401) on the others,
// which share the data dir but keep their own token files; the admin
// token works through every node.
func TestServe_NATSClusterTokensPerNode(t *testing.T) {
	if os.Getenv("AGENTHOST_CLUSTER_TESTS") == "" {
		t.Skip("set AGENTHOST_CLUSTER_TESTS=1 (make test does) to run the cluster process tests")
	}
	admin := "cluster-test-token"
	nodes := startServeCluster(t, admin, false, [3]string{"", "", ""})
	code, body := call(t, "POST", nodes[0].url+"v1/tokens", admin, `{"rooms":["r"],"can":["read"],"label":"n1's"}`)
	var tok struct{ Token string }
	if code != http.StatusCreated || json.Unmarshal(body, &tok) != nil || tok.Token == "" {
		t.Fatalf("token on n1: %d %s", code, body)
	}
	if code, body := call(t, "GET", nodes[0].url+"v1/rooms", tok.Token, ""); code != 200 {
		t.Fatalf("the token on n1: %d %s", code, body)
	}
	for _, n := range nodes[1:] {
		if code, body := call(t, "GET", n.url+"v1/rooms", tok.Token, ""); code != http.StatusUnauthorized {
			t.Fatalf("n1's token on %s: %d %s", n.name, code, body)
		}
		if code, body := call(t, "GET", n.url+"v1/rooms", admin, ""); code != 200 {
			t.Fatalf("the admin token on %s: %d %s", n.name, code, body)
		}
	}
}
