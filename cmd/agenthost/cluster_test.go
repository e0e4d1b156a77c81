package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/internal/natsroom"
)

// serveNode is one `agenthost serve --nats-embedded` process.
type serveNode struct {
	name string
	role string // "" is both
	cmd  *exec.Cmd
	url  string
	err  *syncBuf
	done bool
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startServeCluster starts three serve processes forming one embedded
// JetStream cluster on loopback, sharing one data dir (the shared storage
// of the README), each running agent the test binary's fake agent; roles
// are the nodes' --role ("" leaves the default, both). A worker serves no
// API: its url is "".
func startServeCluster(t *testing.T, token string, realAgent bool, roles [3]string) []*serveNode {
	t.Helper()
	var cports [3]int
	for i := range cports {
		cports[i] = freeTCPPort(t)
	}
	return startServeClusterAt(t, t.TempDir(), cports, token, realAgent, roles)
}

// startServeClusterAt is startServeCluster in data, on the route ports
// cports: a cluster started again there (its nodes stopped) is the same
// cluster, restarted.
func startServeClusterAt(t *testing.T, data string, cports [3]int, token string, realAgent bool, roles [3]string) []*serveNode {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The fake agent's switch goes to the agent only, not to serve. The
	// fake agent (this test binary, run by env) lies outside what a
	// confined agent may execute: it runs unconfined (confinement has its
	// own tests; omp, below, runs confined).
	agent := []string{"--confine", "off", "--", "/usr/bin/env", fakeAgentEnv + "=1", "GORACE=atexit_sleep_ms=0", exe, "-test.run=^$"}
	if realAgent {
		agent = nil // omp on each node's built-in model
	}
	nodes := make([]*serveNode, 3)
	lines := make([]chan string, 3)
	for i := range 3 {
		var routes []string
		for j := range 3 {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", cports[j]))
			}
		}
		name := fmt.Sprintf("n%d", i+1)
		args := []string{"serve", "--listen", "127.0.0.1:0", "--data", data, "--node", name, "--nats-embedded",
			"--nats-listen", "127.0.0.1:0", "--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", cports[i]),
			"--nats-routes", strings.Join(routes, ",")}
		if roles[i] != "" {
			args = append(args, "--role", roles[i])
		}
		cmd := exec.Command(os.Args[0], append(args, agent...)...)
		cmd.Env = append(os.Environ(), serveHelperEnv+"=1", "AGENTHOST_TOKEN="+token)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		n := &serveNode{name: name, role: roles[i], cmd: cmd, err: &syncBuf{}}
		cmd.Stderr = n.err
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		nodes[i] = n
		t.Cleanup(func() {
			if t.Failed() {
				lines := strings.Split(n.err.String(), "\n")
				t.Logf("%s's log, last lines:\n%s", n.name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
			if !n.done {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				ch := make(chan struct{})
				go func() { _ = cmd.Wait(); close(ch) }()
				select {
				case <-ch:
				case <-time.After(30 * time.Second):
					_ = cmd.Process.Kill()
					<-ch
				}
			}
		})
		lines[i] = make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			if sc.Scan() {
				lines[i] <- sc.Text()
			}
			close(lines[i])
			_, _ = io.Copy(io.Discard, stdout)
		}()
	}
	for i, n := range nodes {
		select {
		case line := <-lines[i]:
			if n.role == "worker" {
				if line != "agenthost: node "+n.name+" running rooms (worker)" {
					t.Fatalf("%s (worker) start line %q; stderr:\n%s", n.name, line, n.err.String())
				}
				continue
			}
			u, _, _ := strings.Cut(strings.TrimPrefix(line, "agenthost: serving rooms at "), " ")
			if !strings.HasPrefix(u, "http://") {
				t.Fatalf("%s start line %q; stderr:\n%s", n.name, line, n.err.String())
			}
			n.url = u
		case <-time.After(90 * time.Second):
			t.Fatalf("%s: no start line; stderr:\n%s", n.name, n.err.String())
		}
	}
	return nodes
}

// roomNode is GET /v1/rooms/{room}'s node through n.
func roomNode(t *testing.T, n *serveNode, token, rm string) string {
	t.Helper()
	code, body := call(t, "GET", n.url+"v1/rooms/"+rm, token, "")
	var st struct{ Node string }
	if code != 200 || json.Unmarshal(body, &st) != nil {
		t.Fatalf("GET room %s through %s: %d %s", rm, n.name, code, body)
	}
	return st.Node
}

// replay is a room's whole event stream (SSE, no follow) through n.
func replay(t *testing.T, ctx context.Context, n *serveNode, token, rm string) []string {
	t.Helper()
	c := newTestClient(t, n.url, token)
	var out []string
	err := c.events(ctx, rm, 0, false, func(typ string, raw []byte) (bool, error) {
		out = append(out, string(raw))
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestServe_NATSClusterProcesses: three serve processes with embedded
// JetStream. Messages to 10 rooms go in through n1 and are watched through
// n2; replay through n3 is the same, event for event. Then the worker
// holding a room mid-turn is SIGKILLed: the cut turn ends failed ("worker
// lost") on another node, the messages queued behind it settle in order,
// and the room's replay is the same through both survivors.
func TestServe_NATSClusterProcesses(t *testing.T) {
	if os.Getenv("AGENTHOST_CLUSTER_TESTS") == "" {
		t.Skip("set AGENTHOST_CLUSTER_TESTS=1 (make test does) to run the cluster process tests")
	}
	token := "cluster-test-token"
	nodes := startServeCluster(t, token, false, [3]string{})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()

	// 10 rooms in through n1, watched through n2.
	want := map[string]string{}
	for i := range 10 {
		rm := fmt.Sprintf("r%d", i)
		code, body := call(t, "POST", nodes[0].url+"v1/rooms/"+rm+"/messages", token, fmt.Sprintf(`{"text":"hello %d"}`, i))
		if code != 202 {
			t.Fatalf("post %s: %d %s", rm, code, body)
		}
		var acc struct {
			ID  string
			Seq int64
		}
		_ = json.Unmarshal(body, &acc)
		want[rm] = acc.ID
	}
	watch := newTestClient(t, nodes[1].url, token)
	for rm, id := range want {
		err := watch.events(ctx, rm, 0, true, func(typ string, raw []byte) (bool, error) {
			var d map[string]any
			_ = json.Unmarshal(raw, &d)
			if typ == "turn.ended" && d["message_id"] == id {
				if d["outcome"] != "settled" {
					return true, fmt.Errorf("room %s: turn ended %s", rm, raw)
				}
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		a, b := replay(t, ctx, nodes[1], token, rm), replay(t, ctx, nodes[2], token, rm)
		if strings.Join(a, "\n") != strings.Join(b, "\n") {
			t.Fatalf("room %s: replay through n2 and n3 differ:\n%s\n---\n%s", rm, strings.Join(a, "\n"), strings.Join(b, "\n"))
		}
		for i, ev := range a {
			var e struct{ Seq int64 }
			_ = json.Unmarshal([]byte(ev), &e)
			if e.Seq != int64(i+1) {
				t.Fatalf("room %s: event %d has seq %d", rm, i, e.Seq)
			}
		}
	}

	// A turn cut by SIGKILL of its worker.
	rm := "kill"
	if code, body := call(t, "POST", nodes[0].url+"v1/rooms/"+rm+"/messages", token, `{"text":"hang"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	err := watch.events(ctx, rm, 0, true, func(typ string, _ []byte) (bool, error) { return typ == "turn.started", nil })
	if err != nil {
		t.Fatal(err)
	}
	var queued []string
	for i := range 2 {
		code, body := call(t, "POST", nodes[0].url+"v1/rooms/"+rm+"/messages", token, fmt.Sprintf(`{"text":"after %d"}`, i))
		if code != 202 {
			t.Fatalf("post: %d %s", code, body)
		}
		var acc struct{ ID string }
		_ = json.Unmarshal(body, &acc)
		queued = append(queued, acc.ID)
	}
	// The lease is read from the nearest replica, which may lag the
	// holder's acquire by a moment.
	holder := roomNode(t, nodes[0], token, rm)
	for deadline := time.Now().Add(10 * time.Second); holder == "" && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond) // polling a read model, no event to wait on
		holder = roomNode(t, nodes[0], token, rm)
	}
	var victim *serveNode
	var survivors []*serveNode
	for _, n := range nodes {
		if n.name == holder {
			victim = n
		} else {
			survivors = append(survivors, n)
		}
	}
	if victim == nil {
		t.Fatalf("room held by %q", holder)
	}
	killed := time.Now()
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.cmd.Wait()
	victim.done = true

	c := newTestClient(t, survivors[0].url, token)
	var cut map[string]any
	var failover time.Duration
	settled := 0
	err = followAcrossElection(ctx, c, rm, func(typ string, raw []byte) (bool, error) {
		var d map[string]any
		_ = json.Unmarshal(raw, &d)
		switch {
		case typ == "turn.ended" && cut == nil:
			cut = d
		case typ == "turn.started" && cut != nil && failover == 0:
			failover = time.Since(killed)
		case typ == "turn.ended":
			if d["outcome"] != "settled" || d["message_id"] != queued[settled] {
				return true, fmt.Errorf("after the failover: %s", raw)
			}
			settled++
		}
		return settled == len(queued), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cut["outcome"] != "failed" || cut["reason"] != "worker lost" {
		t.Fatalf("the cut turn ended %v", cut)
	}
	t.Logf("failover: the room's next turn started %v after the SIGKILL (lease 3 s)", failover.Round(time.Millisecond))
	if now := roomNode(t, survivors[1], token, rm); now == "" || now == holder {
		t.Fatalf("room now held by %q", now)
	}
	a, b := replay(t, ctx, survivors[0], token, rm), replay(t, ctx, survivors[1], token, rm)
	if strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Fatalf("replay differs across the survivors")
	}
}

// TestServe_NATSClusterOMPApprovalAcrossNodes: a real omp turn on a
// three-process cluster of each role (n1 --role frontend, n2 both, n3
// --role worker): the message goes in through n1, a worker holds the room,
// the agent asks for an approval, a node that does not hold the room
// allows it, and the turn settles; the whole room replays the same
// through every node that serves the API.
func TestServe_NATSClusterOMPApprovalAcrossNodes(t *testing.T) {
	if os.Getenv("AGENTHOST_CLUSTER_TESTS") == "" {
		t.Skip("set AGENTHOST_CLUSTER_TESTS=1 (make test does) to run the cluster process tests")
	}
	token := "cluster-test-token"
	nodes := startServeCluster(t, token, true, [3]string{"frontend", "", "worker"})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	rm := "omp"
	// The room's settings, set through the front end before the room has
	// a message: a budget of one turn, and a memory limit the node that
	// runs the room's agent starts it under (limits are settings: they
	// follow the room).
	if code, body := call(t, "PUT", nodes[0].url+"v1/rooms/"+rm+"/config", token, `{"budget":{"turns":1},"resources":{"memory":"768M","pids":512}}`); code != 200 {
		t.Fatalf("PUT config through the front end: %d %s", code, body)
	}
	code, body := call(t, "POST", nodes[0].url+"v1/rooms/"+rm+"/messages", token, `{"text":"Run this: [[tool:bash {\"command\":\"echo cross-node\"}]]"}`)
	if code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	watch := newTestClient(t, nodes[1].url, token)
	var approval string
	var started map[string]any
	err := watch.events(ctx, rm, 0, true, func(typ string, raw []byte) (bool, error) {
		var d map[string]any
		_ = json.Unmarshal(raw, &d)
		if typ == "turn.ended" {
			return true, fmt.Errorf("the turn ended before asking: %s", raw)
		}
		if typ == "agent.started" {
			started = d
		}
		if typ == "approval.requested" {
			approval, _ = d["approval_id"].(string)
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	holder := roomNode(t, nodes[0], token, rm)
	if holder != "n2" && holder != "n3" {
		t.Fatalf("room held by %q; only n2 and n3 run rooms (n1 is --role frontend)", holder)
	}
	if res, _ := started["resources"].(map[string]any); res == nil || res["memory"] != float64(768<<20) || res["pids"] != float64(512) {
		t.Fatalf("the agent %s started, under the limits set through the front end: %v", holder, started)
	}
	var other *serveNode
	for _, n := range nodes {
		if n.name != holder && n.url != "" && other == nil {
			other = n
		}
	}
	if code, body := call(t, "POST", other.url+"v1/rooms/"+rm+"/approvals/"+approval, token, `{"decision":"allow"}`); code != 200 && code != 204 {
		t.Fatalf("approve through %s (holder %s): %d %s", other.name, holder, code, body)
	}
	var ended map[string]any
	err = watch.events(ctx, rm, 0, true, func(typ string, raw []byte) (bool, error) {
		if typ == "turn.ended" {
			_ = json.Unmarshal(raw, &ended)
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ended["outcome"] != "settled" || ended["text"] != "done" {
		t.Fatalf("turn ended %v", ended)
	}
	// The budget holds across nodes: the front end refuses the next
	// message, naming the limit, when its read of the room's log has the
	// turn's end (a replica may lag it); else the holder refuses it, and
	// the message the front end accepted ends failed, saying why.
	code, body = call(t, "POST", nodes[0].url+"v1/rooms/"+rm+"/messages", token, `{"text":"more"}`)
	switch {
	case code == 429 && strings.Contains(string(body), "room budget exhausted: 1 of 1 turns run"):
	case code == 202:
		var acc struct{ ID string }
		_ = json.Unmarshal(body, &acc)
		var end map[string]any
		err = watch.events(ctx, rm, 0, true, func(typ string, raw []byte) (bool, error) {
			var d map[string]any
			_ = json.Unmarshal(raw, &d)
			if typ == "message.ended" && d["message_id"] == acc.ID {
				end = d
				return true, nil
			}
			return false, nil
		})
		if reason, _ := end["reason"].(string); err != nil || end["outcome"] != "failed" || !strings.Contains(reason, "room budget exhausted") {
			t.Fatalf("a message over the budget, accepted by the front end: %v %v", end, err)
		}
	default:
		t.Fatalf("a message over the budget through the front end: %d %s", code, body)
	}
	if code, body := call(t, "PUT", nodes[1].url+"v1/rooms/"+rm+"/config", token, `{"budget":{"turns":2}}`); code != 200 {
		t.Fatalf("raising the budget through n2: %d %s", code, body)
	}
	if code, body := call(t, "POST", nodes[0].url+"v1/rooms/"+rm+"/messages", token, `{"text":"after the raise"}`); code != 202 {
		t.Fatalf("a message after the raise: %d %s", code, body)
	}
	ended = nil
	err = watch.events(ctx, rm, 0, true, func(typ string, raw []byte) (bool, error) {
		var d map[string]any
		_ = json.Unmarshal(raw, &d)
		if typ == "turn.ended" && d["text"] == "ok: after the raise" {
			ended = d
			return true, nil
		}
		return false, nil
	})
	if err != nil || ended["outcome"] != "settled" {
		t.Fatalf("the turn after the raise: %v %v", ended, err)
	}
	a := replay(t, ctx, nodes[0], token, rm)
	for _, n := range nodes[1:] {
		if n.url == "" {
			continue // a worker serves no API
		}
		if b := replay(t, ctx, n, token, rm); strings.Join(a, "\n") != strings.Join(b, "\n") {
			t.Fatalf("replay through %s differs from n1", n.name)
		}
	}
}

// followAcrossElection follows a room's events, resuming after the last
// one seen when the node answers 503: while the cluster elects a new
// stream leader (seconds after a node died), reads fail and the API says
// so.
func followAcrossElection(ctx context.Context, c *testClient, rm string, fn func(typ string, raw []byte) (bool, error)) error {
	var after int64
	for {
		err := c.events(ctx, rm, after, true, func(typ string, raw []byte) (bool, error) {
			var e struct{ Seq int64 }
			_ = json.Unmarshal(raw, &e)
			after = e.Seq
			return fn(typ, raw)
		})
		if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "503") {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// serveProc is one `agenthost serve` process of a test (stderr kept).
type serveProc struct {
	cmd    *exec.Cmd
	stderr *syncBuf
	lines  chan string // stdout, line by line
	exited chan struct{}
	err    error // its exit, once exited is closed
	term   sync.Once
}

// startServeProc starts `agenthost serve args...` (the test binary as the
// CLI) with the API token; stop sends SIGTERM and waits (t.Cleanup too).
func startServeProc(t *testing.T, token string, args ...string) *serveProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve"}, args...)...)
	cmd.Env = append(os.Environ(), serveHelperEnv+"=1", "AGENTHOST_TOKEN="+token)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &serveProc{cmd: cmd, stderr: &syncBuf{}, lines: make(chan string, 16), exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.stop)
	return p
}

// stop sends SIGTERM (once: a second one ends serve at once, without its
// graceful shutdown) and waits for the exit, killing after 30 s.
func (p *serveProc) stop() {
	p.term.Do(func() { _ = p.cmd.Process.Signal(syscall.SIGTERM) })
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// url waits for the start line and returns the API's base URL.
func (p *serveProc) url(t *testing.T) string {
	t.Helper()
	select {
	case line := <-p.lines:
		u, _, _ := strings.Cut(strings.TrimPrefix(line, "agenthost: serving rooms at "), " ")
		u, _, _ = strings.Cut(u, "#")
		if !strings.HasPrefix(u, "http://") {
			t.Fatalf("start line %q; stderr:\n%s", line, p.stderr.String())
		}
		return u
	case <-p.exited:
		t.Fatalf("serve exited: %v\n%s", p.err, p.stderr.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("no start line; stderr:\n%s", p.stderr.String())
	}
	return ""
}

// waitExit waits for the process to exit on its own within d.
func (p *serveProc) waitExit(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("serve did not exit within %v; stderr:\n%s", d, p.stderr.String())
	}
}

// TestServe_NATSClusterRefusesStrangers: serve's embedded node takes no
// client and no route that does not sign in with the cluster's secret
// (before, a bare connection to its client port could put a prompt in any
// room's inbox, and any server could join as a route).
func TestServe_NATSClusterRefusesStrangers(t *testing.T) {
	if os.Getenv("AGENTHOST_CLUSTER_TESTS") == "" {
		t.Skip("set AGENTHOST_CLUSTER_TESTS=1 (make test does) to run the cluster process tests")
	}
	data := t.TempDir()
	secret := "a secret only the cluster's nodes know"
	if err := os.WriteFile(filepath.Join(data, "nats-secret"), []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nport, cport, mport := freeTCPPort(t), freeTCPPort(t), freeTCPPort(t)
	exe, _ := os.Executable()
	p := startServeProc(t, "tok", "--listen", "127.0.0.1:0", "--data", data, "--node", "n1", "--nats-embedded",
		"--nats-listen", fmt.Sprintf("127.0.0.1:%d", nport), "--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", cport),
		"--nats-routes", fmt.Sprintf("nats://127.0.0.1:%d", mport), "--nats-replicas", "1",
		"--confine", "off", "--", "/usr/bin/env", fakeAgentEnv+"=1", exe, "-test.run=^$")
	// Its peer: a node that has the secret.
	member, err := natsroom.StartNode(natsroom.NodeConfig{Name: "m1", StoreDir: t.TempDir(),
		ClusterListen: fmt.Sprintf("127.0.0.1:%d", mport), Routes: []string{fmt.Sprintf("nats://127.0.0.1:%d", cport)}, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	// The peer closes after serve has stopped: without it, serve's
	// shutdown waited out the timeouts of a cluster that lost its quorum
	// (about 9 s).
	t.Cleanup(func() { p.stop(); member.Close() })
	base := p.url(t)
	clientURL := fmt.Sprintf("nats://127.0.0.1:%d", nport)
	if nc, err := nats.Connect(clientURL, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without the cluster's secret was let in")
	}
	// A stranger's route is refused: the node says so, and the stranger
	// has no route.
	stranger, err := natsroom.StartNode(natsroom.NodeConfig{Name: "x1", StoreDir: t.TempDir(),
		ClusterListen: fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t)), Routes: []string{fmt.Sprintf("nats://127.0.0.1:%d", cport)}})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(p.stderr.String(), "authentication error"); {
		if stranger.NumRoutes() > 0 {
			t.Fatal("a route without the cluster's secret joined")
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node never refused the stranger's route; stderr:\n%s", p.stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // polling the node's log: no other event says it
	}
	if stranger.NumRoutes() > 0 {
		t.Fatal("a route without the cluster's secret joined")
	}
	// The cluster itself works.
	if code, body := call(t, "POST", base+"v1/rooms/safe/messages", "tok", `{"text":"hello"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	if ended := waitTurnEnded(t, base, "tok", "safe"); ended["outcome"] != "settled" {
		t.Fatalf("turn ended %v", ended)
	}
}

// TestServe_NATSConfigErrorsSayWhatToChange: a single external server
// with the default 3 replicas, and a busy port, fail at once saying what
// to change (before: 60 s of retries, and "not ready after 10s").
func TestServe_NATSConfigErrorsSayWhatToChange(t *testing.T) {
	if os.Getenv("AGENTHOST_CLUSTER_TESTS") == "" {
		t.Skip("set AGENTHOST_CLUSTER_TESTS=1 (make test does) to run the cluster process tests")
	}
	node, err := natsroom.StartNode(natsroom.NodeConfig{Name: "single", StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	p := startServeProc(t, "tok", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--node", "x1", "--nats", node.ClientURL())
	p.waitExit(t, 30*time.Second)
	if !strings.Contains(p.stderr.String(), "--nats-replicas 1") {
		t.Fatalf("serve on one server with 3 replicas said:\n%s", p.stderr.String())
	}

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	p = startServeProc(t, "tok", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--node", "x1", "--nats-embedded",
		"--nats-listen", busy.Addr().String())
	p.waitExit(t, 30*time.Second)
	if s := p.stderr.String(); !strings.Contains(s, busy.Addr().String()) || !strings.Contains(s, "address already in use") {
		t.Fatalf("serve on a busy --nats-listen said:\n%s", s)
	}
}

// TestServe_NATSStorageFullAnswers503AndKeepsTheRooms: JetStream out of
// storage refuses new messages with 503 and a reason (it was a 500), and
// the rooms held go on renewing their leases (they were all dropped).
func TestServe_NATSStorageFullAnswers503AndKeepsTheRooms(t *testing.T) {
	if os.Getenv("AGENTHOST_CLUSTER_TESTS") == "" {
		t.Skip("set AGENTHOST_CLUSTER_TESTS=1 (make test does) to run the cluster process tests")
	}
	ns, err := server.NewServer(&server.Options{ServerName: "small", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: 3 << 20, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	// A cleanup, so that it runs after serve's (cleanups run last
	// first): without its server, serve's shutdown waited out its
	// requests' timeouts (about 8 s).
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the server did not start")
	}
	exe, _ := os.Executable()
	p := startServeProc(t, "tok", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--node", "x1", "--nats", ns.ClientURL(),
		"--nats-replicas", "1", "--confine", "off", "--", "/usr/bin/env", fakeAgentEnv+"=1", exe, "-test.run=^$")
	base := p.url(t)
	if code, body := call(t, "POST", base+"v1/rooms/held/messages", "tok", `{"text":"hold on: hang"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	cl := newTestClient(t, base, "tok")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := cl.events(ctx, "held", 0, true, func(typ string, _ []byte) (bool, error) { return typ == "turn.started", nil }); err != nil {
		t.Fatal(err)
	}
	big, _ := json.Marshal(map[string]string{"text": strings.Repeat("x", 200<<10)})
	var code int
	var body []byte
	for i := 0; i < 40; i++ {
		if code, body = call(t, "POST", base+"v1/rooms/big/messages", "tok", string(big)); code != 202 && code != 429 {
			break
		}
	}
	if code != 503 || !strings.Contains(string(body), "storage") {
		t.Fatalf("a message past the storage limit: %d %s; want 503 saying the storage is full", code, body)
	}
	// The held room's lease is renewed all the same.
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, natsroom.BucketLease)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, base64.RawURLEncoding.EncodeToString([]byte("held")), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	for renewed := 0; renewed < 3; {
		select {
		case <-ctx.Done():
			t.Fatal("the held room's lease was not renewed while the storage was full")
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut || string(e.Value()) != "x1" {
				t.Fatalf("the held room's lease: %s %q", e.Operation(), e.Value())
			}
			renewed++
		}
	}
	if node := roomNodeURL(t, base, "tok", "held"); node != "x1" {
		t.Fatalf("the held room is held by %q", node)
	}
}

// roomNodeURL is GET /v1/rooms/{room}'s node through base.
func roomNodeURL(t *testing.T, base, token, rm string) string {
	t.Helper()
	code, body := call(t, "GET", base+"v1/rooms/"+rm, token, "")
	var st struct{ Node string }
	if code != 200 || json.Unmarshal(body, &st) != nil {
		t.Fatalf("GET room %s: %d %s", rm, code, body)
	}
	return st.Node
}

// TestLoadSecret_MadeOnceAndPrivate: the cluster secret is made on first
// use, readable by its owner only, and nodes making it at the same moment
// all read the same one.
func TestLoadSecret_MadeOnceAndPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nats-secret")
	var wg sync.WaitGroup
	got := make([]string, 8)
	errs := make([]error, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = loadSecret(path)
		}()
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i] == "" || got[i] != got[0] {
			t.Fatalf("node %d read %q (%v); node 0 read %q", i, got[i], errs[i], got[0])
		}
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the secret's file: %v %v", fi.Mode(), err)
	}
}

// TestServe_NATSNodeWaitsForLatePeers: a node of a three-node cluster
// started alone waits for its peers, saying so (it exited after 60 s),
// and serves once they come.
func TestServe_NATSNodeWaitsForLatePeers(t *testing.T) {
	if os.Getenv("AGENTHOST_CLUSTER_TESTS") == "" {
		t.Skip("set AGENTHOST_CLUSTER_TESTS=1 (make test does) to run the cluster process tests")
	}
	data := t.TempDir()
	exe, _ := os.Executable()
	var cports [3]int
	for i := range cports {
		cports[i] = freeTCPPort(t)
	}
	start := func(i int) *serveProc {
		var routes []string
		for j := range 3 {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", cports[j]))
			}
		}
		return startServeProc(t, "tok", "--listen", "127.0.0.1:0", "--data", data, "--node", fmt.Sprintf("n%d", i+1), "--nats-embedded",
			"--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", cports[i]), "--nats-routes", strings.Join(routes, ","),
			"--confine", "off", "--", "/usr/bin/env", fakeAgentEnv+"=1", exe, "-test.run=^$")
	}
	first := start(0)
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(first.stderr.String(), "waiting for the cluster's JetStream"); {
		select {
		case <-first.exited:
			t.Fatalf("the node exited while its peers were not up: %v\n%s", first.err, first.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node never said what it waits for:\n%s", first.stderr.String())
		}
		time.Sleep(100 * time.Millisecond) // polling its log: no other event says it
	}
	start(1)
	start(2)
	base := first.url(t)
	if code, body := call(t, "POST", base+"v1/rooms/late/messages", "tok", `{"text":"hello"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	if ended := waitTurnEnded(t, base, "tok", "late"); ended["outcome"] != "settled" {
		t.Fatalf("turn ended %v", ended)
	}
}
