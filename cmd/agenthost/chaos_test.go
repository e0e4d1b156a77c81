package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/internal/natsroom"
)

// The fault-injection checker (issue 16): several rooms driven through a
// three-node cluster of serve processes while it injects, one after
// another, each fault of a round: kill -9 of a room's holder, SIGSTOP of
// a holder beyond its lease, a lost answer to a log append, a full queue,
// and a restart of the whole cluster; with AGENTHOST_CHAOS_LONG (make
// chaos, issue 48) also kill -9 of the node that leads the rooms' log and
// the lease bucket, a partition of that node healed 15 s later, and (as
// root, the data dir on a tmpfs) a full disk, then freed. Then it checks,
// from the API and from the agents' own journal: every message answered
// 202 ended exactly once; each room's turns ran in the order of
// acceptance; no two turns of a room overlapped; each room's log has
// contiguous sequence numbers and replays identically through every node;
// and no turn failed in a room whose holder no fault hit (a stream's
// election costs a held room a pause, not a turn).
//
// The agent is a small fake (journalAgent) that writes each turn's start,
// its activity every 25 ms (its side effects) and its end to a journal
// file: the faults are the cluster's, not the agent's.
//
// Size: AGENTHOST_CHAOS_ROUNDS rounds of the five faults (default 1, as
// make test runs it: about a minute and a half on 2 cores) over
// AGENTHOST_CHAOS_ROOMS rooms (default 4); make chaos runs 5 rounds over 8
// rooms, with the long faults.

// journalAgentEnv makes the test binary the journalling fake agent; its
// value is the journal's path (the node's name in chaosNodeEnv).
const (
	journalAgentEnv = "AGENTHOST_CHAOS_JOURNAL"
	chaosNodeEnv    = "AGENTHOST_CHAOS_NODE"
)

func init() {
	if p := os.Getenv(journalAgentEnv); p != "" {
		journalAgent(p, os.Getenv(chaosNodeEnv))
		os.Exit(0)
	}
}

// journalAgent is an RPC agent whose prompt "work MS LABEL" is a turn of
// MS milliseconds that journals "start", a "tick" every 25 ms, and "end"
// (or "abort"), each line "KIND NODE PID LABEL UNIXNANO", with O_APPEND
// (whole lines from every agent of every node).
func journalAgent(path, node string) {
	var outMu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	send := func(s string) {
		outMu.Lock()
		out.WriteString(s)
		out.WriteByte('\n')
		out.Flush()
		outMu.Unlock()
	}
	journal := func(kind, label string) {
		fh, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return
		}
		fmt.Fprintf(fh, "%s %s %d %s %d\n", kind, node, os.Getpid(), label, time.Now().UnixNano())
		fh.Close()
	}
	send(`{"type":"ready","supportedProtocolVersions":[1]}`)
	var mu sync.Mutex
	var abort chan struct{} // the running turn's, nil when none runs
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var cmd struct{ ID, Type, Message string }
		if json.Unmarshal(in.Bytes(), &cmd) != nil {
			continue
		}
		id, _ := json.Marshal(cmd.ID)
		switch cmd.Type {
		case "get_state":
			mu.Lock()
			streaming := abort != nil
			mu.Unlock()
			send(`{"id":` + string(id) + `,"type":"response","command":"get_state","success":true,"data":{"isStreaming":` + strconv.FormatBool(streaming) + `}}`)
		case "abort":
			send(`{"id":` + string(id) + `,"type":"response","command":"abort","success":true}`)
			mu.Lock()
			if abort != nil {
				close(abort)
				abort = nil
			}
			mu.Unlock()
		case "prompt":
			send(`{"id":` + string(id) + `,"type":"response","command":"prompt","success":true}`)
			text := cmd.Message
			if i := strings.LastIndex(text, "\n"); i >= 0 {
				text = text[i+1:] // a transcript may come first
			}
			f := strings.Fields(text)
			ms, label := 0, "?"
			if len(f) == 3 && f[0] == "work" {
				ms, _ = strconv.Atoi(f[1])
				label = f[2]
			}
			stop := make(chan struct{})
			mu.Lock()
			abort = stop
			mu.Unlock()
			go func() {
				send(`{"type":"agent_start"}`)
				journal("start", label)
				end := time.Now().Add(time.Duration(ms) * time.Millisecond)
				tick := time.NewTicker(25 * time.Millisecond)
				defer tick.Stop()
				reason, kind := "stop", "end"
			run:
				for time.Now().Before(end) {
					select {
					case <-stop:
						reason, kind = "aborted", "abort"
						break run
					case <-tick.C:
						journal("tick", label)
						send(`{"type":"message_update","message":{"role":"assistant","content":[{"type":"text","text":"."}]},"assistantMessageEvent":{"type":"text_delta","delta":"."}}`)
					}
				}
				journal(kind, label)
				mu.Lock()
				if abort == stop {
					abort = nil
				}
				mu.Unlock()
				send(`{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"done ` + label + `"}],"stopReason":"` + reason + `"}}`)
				send(`{"type":"agent_end","messages":[]}`)
			}()
		}
	}
}

// routeProxy forwards a route's TCP connections to a node; each direction
// can be held (its bytes wait, as on a stalled link), and the route cut
// (its connections reset, new ones refused: a partition).
type routeProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	held   [2]bool // [0] client to target, [1] target to client
	isCut  bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newRouteProxy(t *testing.T, target string) *routeProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &routeProxy{l: l, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p
}

func (p *routeProxy) addr() string { return p.l.Addr().String() }

func (p *routeProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.isCut
		p.mu.Unlock()
		if cut {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, c, 0)
		go p.pipe(c, up, 1)
	}
}

// cut resets the route's connections and refuses new ones (on), or lets
// them be made again.
func (p *routeProxy) cut(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isCut = on
	if on {
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
	}
}

func (p *routeProxy) pipe(dst, src net.Conn, dir int) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.held[dir] {
			p.cond.Wait()
		}
		p.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				_ = src.Close()
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

func (p *routeProxy) hold(dir int, on bool) {
	p.mu.Lock()
	p.held[dir] = on
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *routeProxy) close() {
	_ = p.l.Close()
	p.mu.Lock()
	p.held = [2]bool{}
	p.cond.Broadcast()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// chaosNode is one serve process of the checker's cluster.
type chaosNode struct {
	name    string
	args    []string
	natsURL string // its client port (the checker reads stream leaders there)
	cmd     *exec.Cmd
	url     string
	stderr  *syncBuf
	alive   bool
	drained chan struct{} // its stdout is read to the end
}

type sentMsg struct {
	id, room, label string
}

type chaosRun struct {
	t        *testing.T
	token    string
	data     string
	journal  string
	tmpfs    bool // data is a tmpfs of the test's own (the full-disk fault)
	nodes    [3]*chaosNode
	proxies  [3][3]*routeProxy // [from][to]
	nc       *nats.Conn        // the checker's own connection (cluster secret)
	auth     nats.Option       // its sign-in
	mu       sync.Mutex        // guards the nodes' liveness and urls, and what follows
	sent     []sentMsg
	refused  int // 429
	unknown  int // no answer (a node went down mid-request)
	failover []time.Duration
	// elections: from the loss of the node leading the log and the lease
	// bucket (its kill, or a partition) to their new leaders.
	elections []time.Duration
	faults    map[string]int
	// streamErrs counts event streams through a survivor that failed to
	// open, or ended, during a failover.
	streamErrs int
	// paused: the turns whose holder was stopped mid-turn, and when.
	paused map[string]time.Time
	labels int // the faults' messages so far
	// windows: when each fault hit which nodes (a turn those nodes held
	// then may fail; any other turn must not).
	windows []faultWindow
}

// faultWindow is a fault's time and the nodes it hit.
type faultWindow struct {
	fault    string
	nodes    map[string]bool
	from, to time.Time
}

// hit records that fault hit nodes from from until now.
func (c *chaosRun) hit(fault string, from time.Time, nodes ...string) {
	c.hitUntil(fault, from, time.Now(), nodes...)
}

// hitUntil records that fault hit nodes from from until to.
func (c *chaosRun) hitUntil(fault string, from, to time.Time, nodes ...string) {
	w := faultWindow{fault: fault, nodes: map[string]bool{}, from: from, to: to}
	for _, n := range nodes {
		w.nodes[n] = true
	}
	c.mu.Lock()
	c.windows = append(c.windows, w)
	c.mu.Unlock()
}

// chaosLong: the long faults run too (make chaos).
func chaosLong() bool { return os.Getenv("AGENTHOST_CHAOS_LONG") != "" }

func chaosSize() (rounds, rooms int) {
	rounds, rooms = 1, 4
	if n, err := strconv.Atoi(os.Getenv("AGENTHOST_CHAOS_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	if n, err := strconv.Atoi(os.Getenv("AGENTHOST_CHAOS_ROOMS")); err == nil && n > 0 {
		rooms = n
	}
	return rounds, rooms
}

// TestServe_NATSClusterFaults is the checker (see the top of this file).
// It needs many seconds: each failover waits for a lease to expire and
// elections to finish.
func TestServe_NATSClusterFaults(t *testing.T) {
	if os.Getenv("AGENTHOST_CLUSTER_TESTS") == "" {
		t.Skip("set AGENTHOST_CLUSTER_TESTS=1 (make test does) to run the cluster process tests")
	}
	rounds, nrooms := chaosSize()
	perRound := 4
	if chaosLong() {
		perRound = 7
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(3+perRound*rounds)*time.Minute)
	defer cancel()
	c := startChaos(t, ctx)
	defer c.stop()
	rooms := make([]string, nrooms)
	for i := range rooms {
		rooms[i] = fmt.Sprintf("c%d", i)
	}

	// Traffic: one poster per room, each message after the last one's
	// answer, through any live node.
	tctx, stopTraffic := context.WithCancel(ctx)
	var traffic sync.WaitGroup
	for _, rm := range rooms {
		traffic.Add(1)
		go func() {
			defer traffic.Done()
			for k := 0; tctx.Err() == nil; k++ {
				c.post(tctx, rm, fmt.Sprintf("work %d %s#%d", 50+rand.IntN(150), rm, k))
				select {
				case <-tctx.Done():
				case <-time.After(time.Duration(200+rand.IntN(400)) * time.Millisecond): // pacing, not a wait for anything
				}
			}
		}()
	}
	began := time.Now()
	phase := func(name string, fn func()) {
		t0 := time.Now()
		fn()
		t.Logf("%s: %v (%v in)", name, time.Since(t0).Round(time.Millisecond), time.Since(began).Round(time.Second))
	}
	for round := range rounds {
		t.Logf("round %d", round+1)
		// The killed node starts again while the next two faults run
		// (each needs two nodes); the pause needs all three.
		var restarted <-chan error
		phase("kill -9", func() { restarted = c.killHolder(ctx, rooms) })
		phase("lost answer", func() { c.loseAnswer(ctx, rooms) })
		phase("full queue", func() { c.fillQueue(ctx, rooms[round%len(rooms)]) })
		phase("node restart", func() {
			if err := <-restarted; err != nil {
				t.Fatal(err)
			}
		})
		// Not in the room just filled: its queue may still be full, and
		// the pause's turn would wait behind all of it.
		filled := rooms[round%len(rooms)]
		phase("SIGSTOP", func() {
			c.pauseHolder(ctx, slices.DeleteFunc(slices.Clone(rooms), func(rm string) bool { return rm == filled && len(rooms) > 1 }))
		})
		phase("whole-cluster restart", func() { c.restartAll(ctx, rooms) })
		if chaosLong() {
			phase("kill -9 of the streams' leader", func() { c.killStreamLeader(ctx) })
			phase("a partition healed", func() { c.partitionHealed(ctx, 15*time.Second) })
			phase("a full disk, freed", func() { c.fillDisk(ctx) })
		}
	}
	stopTraffic()
	traffic.Wait()
	phase("checks", func() { c.checkAll(ctx, rooms) })
}

func startChaos(t *testing.T, ctx context.Context) *chaosRun {
	t.Helper()
	c := &chaosRun{t: t, token: "chaos-token", data: t.TempDir(), faults: map[string]int{}, paused: map[string]time.Time{}}
	// Outside the data dir: the full-disk fault fills that.
	c.journal = filepath.Join(t.TempDir(), "journal")
	if chaosLong() && os.Geteuid() == 0 {
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", c.data).CombinedOutput(); err != nil {
			t.Logf("the full-disk fault will not run: mounting a tmpfs for the data dir: %v: %s", err, out)
		} else {
			c.tmpfs = true
			t.Cleanup(func() {
				if out, err := exec.Command("umount", "-l", c.data).CombinedOutput(); err != nil {
					t.Errorf("umount %s: %v: %s", c.data, err, out)
				}
			})
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var cport, nport [3]int
	for i := range 3 {
		cport[i], nport[i] = freeTCPPort(t), freeTCPPort(t)
	}
	dead := freeTCPPort(t)
	for i := range 3 {
		for j := range 3 {
			if i != j {
				c.proxies[i][j] = newRouteProxy(t, fmt.Sprintf("127.0.0.1:%d", cport[j]))
			}
		}
	}
	for i := range 3 {
		name := fmt.Sprintf("n%d", i+1)
		var routes []string
		for j := range 3 {
			if j != i {
				routes = append(routes, "nats://"+c.proxies[i][j].addr())
			}
		}
		args := []string{"serve", "--listen", "127.0.0.1:0", "--data", c.data, "--node", name, "--nats-embedded",
			"--nats-listen", fmt.Sprintf("127.0.0.1:%d", nport[i]), "--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", cport[i]),
			"--nats-cluster-advertise", fmt.Sprintf("127.0.0.1:%d", dead), "--nats-routes", strings.Join(routes, ","),
			"--confine", "off", "--", "/usr/bin/env", journalAgentEnv + "=" + c.journal, chaosNodeEnv + "=" + name, "GORACE=atexit_sleep_ms=0", exe, "-test.run=^$"}
		if os.Getenv("AGENTHOST_CHAOS_LOGS") != "" {
			args = append([]string{"serve", "-v"}, args[1:]...) // the logs kept: with the debug lines
		}
		c.nodes[i] = &chaosNode{name: name, args: args, natsURL: fmt.Sprintf("nats://127.0.0.1:%d", nport[i])}
	}
	t.Cleanup(func() {
		dir := os.Getenv("AGENTHOST_CHAOS_LOGS")
		if !t.Failed() && dir == "" {
			return
		}
		for _, n := range c.nodes {
			if n.stderr == nil {
				continue
			}
			log := n.stderr.String()
			if dir != "" {
				_ = os.WriteFile(filepath.Join(dir, n.name+".log"), []byte(log), 0o644)
				continue
			}
			lines := strings.Split(log, "\n")
			t.Logf("%s's log, last lines (AGENTHOST_CHAOS_LOGS=DIR keeps it whole):\n%s", n.name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
		if dir != "" {
			b, _ := os.ReadFile(c.journal)
			_ = os.WriteFile(filepath.Join(dir, "journal"), b, 0o644)
		}
	})
	t0 := time.Now()
	if err := c.startNodes(ctx, 0, 1, 2); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up in %v", time.Since(t0).Round(time.Millisecond))
	secret, err := os.ReadFile(filepath.Join(c.data, "nats-secret"))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := natsroom.Auth(strings.TrimSpace(string(secret)))
	if err != nil {
		t.Fatal(err)
	}
	c.auth = auth
	urls := []string{c.nodes[0].natsURL, c.nodes[1].natsURL, c.nodes[2].natsURL}
	if c.nc, err = nats.Connect(strings.Join(urls, ","), auth, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	return c
}

// startNodes starts the nodes i (all at once: a cluster's JetStream needs
// a quorum) and waits for their start lines.
func (c *chaosRun) startNodes(ctx context.Context, idx ...int) error {
	lines := map[int]chan string{}
	for _, i := range idx {
		n := c.nodes[i]
		cmd := exec.Command(os.Args[0], n.args...)
		cmd.Env = append(os.Environ(), serveHelperEnv+"=1", "AGENTHOST_TOKEN="+c.token)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if n.stderr == nil {
			n.stderr = &syncBuf{} // one for the node's whole test, across restarts
		}
		cmd.Stderr = n.stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		c.mu.Lock()
		n.cmd, n.drained = cmd, make(chan struct{})
		c.mu.Unlock()
		ch := make(chan string, 1)
		lines[i] = ch
		drained := n.drained
		go func() {
			defer close(drained)
			sc := bufio.NewScanner(stdout)
			if sc.Scan() {
				ch <- sc.Text()
			}
			close(ch)
			_, _ = io.Copy(io.Discard, stdout)
		}()
	}
	for _, i := range idx {
		n := c.nodes[i]
		select {
		case line := <-lines[i]:
			u, _, _ := strings.Cut(strings.TrimPrefix(line, "agenthost: serving rooms at "), " ")
			u, _, _ = strings.Cut(u, "#")
			if !strings.HasPrefix(u, "http://") {
				return fmt.Errorf("%s start line %q", n.name, line)
			}
			c.mu.Lock()
			n.url, n.alive = u, true
			c.mu.Unlock()
		case <-ctx.Done():
			return fmt.Errorf("%s: no start line", n.name)
		}
	}
	return nil
}

// kill ends node i with sig (SIGKILL: a crash) and waits for it.
func (c *chaosRun) kill(i int) {
	n := c.nodes[i]
	c.mu.Lock()
	n.alive = false
	cmd, drained := n.cmd, n.drained
	c.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	<-drained
}

func (c *chaosRun) stop() {
	// The nodes are stopped together: one after the other, the last
	// one's shutdown outlived its cluster's quorum (about 15 s of this
	// test's end, against about 3 s together).
	exits := map[int]chan struct{}{}
	for i, n := range c.nodes {
		if n == nil || n.cmd == nil {
			continue
		}
		c.mu.Lock()
		alive := n.alive
		c.mu.Unlock()
		if !alive {
			continue
		}
		_ = n.cmd.Process.Signal(syscall.SIGCONT)
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = n.cmd.Wait(); close(done) }()
		exits[i] = done
	}
	for i, n := range c.nodes {
		done, ok := exits[i]
		if !ok {
			continue
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			// Killed, and waited for by the goroutine above alone (a
			// second Wait of the same command races it).
			c.mu.Lock()
			n.alive = false
			c.mu.Unlock()
			_ = n.cmd.Process.Signal(syscall.SIGKILL)
			<-done
		}
		<-n.drained
	}
	if c.nc != nil {
		c.nc.Close()
	}
	for i := range 3 {
		for j := range 3 {
			if p := c.proxies[i][j]; p != nil {
				p.close()
			}
		}
	}
}

// live is the API url of a live node, one at random; "" when none is.
func (c *chaosRun) live(except string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var urls []string
	for _, n := range c.nodes {
		if n.alive && n.name != except {
			urls = append(urls, n.url)
		}
	}
	if len(urls) == 0 {
		return ""
	}
	return urls[rand.IntN(len(urls))]
}

var chaosHTTP = &http.Client{Timeout: 30 * time.Second}

func (c *chaosRun) do(ctx context.Context, method, url, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	res, err := chaosHTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

// postFault sends a fault's message ("work MS LABEL") to rm until one is
// answered 202 (one refused, or lost with its node, never runs: a wait
// for its turn would be a wait for nothing), and returns its label.
func (c *chaosRun) postFault(ctx context.Context, rm, kind string, ms int) string {
	c.t.Helper()
	for ctx.Err() == nil {
		label := c.label(rm, kind)
		if c.post(ctx, rm, fmt.Sprintf("work %d %s", ms, label)) {
			return label
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond): // a full queue or an election: try again
		}
	}
	c.t.Fatalf("no %s message to %s was accepted", kind, rm)
	return ""
}

// post sends text to rm through a live node and records the answer; ok
// is whether it was answered 202.
func (c *chaosRun) post(ctx context.Context, rm, text string) (ok bool) {
	u := c.live("")
	if u == "" {
		return false
	}
	body, _ := json.Marshal(map[string]string{"text": text})
	code, b, err := c.do(ctx, "POST", u+"v1/rooms/"+rm+"/messages", string(body))
	label := strings.Fields(text)[2]
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil:
		if ctx.Err() == nil {
			c.unknown++ // the node went down mid-request: no promise was made
		}
	case code == http.StatusAccepted:
		var acc struct{ ID string }
		_ = json.Unmarshal(b, &acc)
		c.sent = append(c.sent, sentMsg{id: acc.ID, room: rm, label: label})
		return true
	case code == http.StatusTooManyRequests:
		c.refused++
	case code == http.StatusServiceUnavailable:
		c.unknown++ // a node shutting down, or the cluster electing: nothing stored
	default:
		c.t.Errorf("POST %s through %s: %d %s", rm, u, code, b)
	}
	return false
}

// roomState is GET /v1/rooms/{room} through a live node.
func (c *chaosRun) roomState(ctx context.Context, rm string) (node string, running bool) {
	u := c.live("")
	if u == "" {
		return "", false
	}
	code, b, err := c.do(ctx, "GET", u+"v1/rooms/"+rm, "")
	if err != nil || code != http.StatusOK {
		return "", false
	}
	var st struct {
		Node string
		Turn *struct{ ID string }
	}
	_ = json.Unmarshal(b, &st)
	return st.Node, st.Turn != nil
}

// busyRoom waits for a room with a turn running on a live node other
// than avoid, and returns it with its holder's index.
func (c *chaosRun) busyRoom(ctx context.Context, rooms []string, avoid int) (string, int) {
	c.t.Helper()
	for ctx.Err() == nil {
		for _, rm := range rooms {
			node, running := c.roomState(ctx, rm)
			if !running {
				continue
			}
			for i, n := range c.nodes {
				c.mu.Lock()
				alive := n.alive
				c.mu.Unlock()
				if n.name == node && alive && i != avoid {
					return rm, i
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond): // polling the rooms' state: the traffic keeps them busy
		}
	}
	c.t.Fatal("no room was running a turn")
	return "", 0
}

// waitTakeover follows rm through a node other than victim until a
// takeover by a node other than victim, and returns how long after since
// the takeover happened.
func (c *chaosRun) waitTakeover(ctx context.Context, rm, victim string, since time.Time) time.Duration {
	c.t.Helper()
	for ctx.Err() == nil {
		u := c.live(victim)
		var took time.Duration
		err := chaosEvents(ctx, u, c.token, rm, 0, true, func(typ string, raw []byte) (bool, error) {
			var d struct {
				Node string
				Time time.Time
			}
			_ = json.Unmarshal(raw, &d)
			if typ == "takeover" && d.Node != victim && d.Time.After(since) {
				// The event's own time (one clock: the nodes run here),
				// not when it was read: the stream replays the room's
				// whole log first, which took 28 s of a "43 s failover"
				// for a room of 6,000 events on a busy machine.
				took = d.Time.Sub(since)
				return true, nil
			}
			return false, nil
		})
		if err == nil && took > 0 {
			return took
		}
		c.mu.Lock()
		c.streamErrs++
		c.mu.Unlock()
		c.t.Logf("following %s through %s: %v (again)", rm, u, err)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	c.t.Fatalf("room %s never moved from %s", rm, victim)
	return 0
}

// killHolder: kill -9 of a room's holder mid-turn; the room moves; the
// node starts again (the channel says when it is up).
func (c *chaosRun) killHolder(ctx context.Context, rooms []string) <-chan error {
	rm, i := c.busyRoom(ctx, rooms, -1)
	victim := c.nodes[i].name
	at := time.Now()
	c.kill(i)
	took := c.waitTakeover(ctx, rm, victim, at)
	c.record("kill -9 of a holder", took)
	c.t.Logf("kill -9 of %s (holding %s): the room moved in %v", victim, rm, took.Round(time.Millisecond))
	done := make(chan error, 1)
	go func() {
		err := c.startNodes(ctx, i)
		c.hit("kill -9 of a holder", at, victim)
		done <- err
	}()
	return done
}

// pauseHolder: SIGSTOP of a room's holder beyond its lease, in the middle
// of a 20 s turn (its agent, not paused itself, would go on working beside
// the new holder's); the room moves; the holder goes on (SIGCONT) and
// finds it lost the room.
func (c *chaosRun) pauseHolder(ctx context.Context, rooms []string) {
	rm, _ := c.busyRoom(ctx, rooms, -1)
	label := c.postFault(ctx, rm, "pause", 20000)
	c.waitTurnOf(ctx, rm, label)
	node, _ := c.roomState(ctx, rm)
	i := slices.IndexFunc(c.nodes[:], func(n *chaosNode) bool { return n.name == node })
	if i < 0 {
		c.t.Fatalf("room %s held by %q", rm, node)
	}
	n := c.nodes[i]
	at := time.Now()
	if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.paused[label] = at
	c.mu.Unlock()
	c.mu.Lock()
	n.alive = false // no requests to a stopped node
	c.mu.Unlock()
	took := c.waitTakeover(ctx, rm, n.name, at)
	if err := n.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	n.alive = true
	c.mu.Unlock()
	// (Resumed, the node finds it lost its rooms, and their turns end
	// failed: the window takes a few seconds past the resume.)
	c.hitUntil("SIGSTOP of a holder", at, time.Now().Add(10*time.Second), n.name)
	c.record("SIGSTOP of a holder beyond its lease", took)
	c.t.Logf("SIGSTOP of %s (holding %s, mid-turn) for %v: the room moved in %v", n.name, rm, time.Since(at).Round(time.Millisecond), took.Round(time.Millisecond))
}

// loseAnswer: the answers to a holder's log appends are held on the way
// back from the log's stream leader until the append's wait ran out; the
// holder must learn that the append landed before it writes again. The
// holder's log says so ("an append's answer was lost").
func (c *chaosRun) loseAnswer(ctx context.Context, rooms []string) {
	c.t.Helper()
	js, _ := jetstream.New(c.nc)
	for attempt := 0; attempt < 5; attempt++ {
		// A turn that streams text for 3 s: its holder appends all along.
		rm, _ := c.busyRoom(ctx, rooms, -1)
		label := c.postFault(ctx, rm, "lost", 3000)
		c.waitTurnOf(ctx, rm, label)
		node, _ := c.roomState(ctx, rm)
		a := slices.IndexFunc(c.nodes[:], func(n *chaosNode) bool { return n.name == node })
		leader := c.streamLeader(ctx, js)
		b := slices.IndexFunc(c.nodes[:], func(n *chaosNode) bool { return n.name == leader })
		c.t.Logf("lost answer, try %d: %q holds %s, %q leads the log", attempt+1, node, rm, leader)
		if a < 0 || b < 0 || b == a {
			// The holder leads the log: another node must, for an answer
			// to cross a route.
			if a >= 0 {
				req, _ := json.Marshal(map[string]any{"placement": map[string]any{"preferred": c.nodes[(a+1)%3].name}})
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, _ = c.nc.RequestWithContext(rctx, "$JS.API.STREAM.LEADER.STEPDOWN."+natsroom.StreamRooms, req)
				cancel()
			}
			continue
		}
		before := strings.Count(c.nodes[a].stderr.String(), "an append's answer was lost")
		// Everything from b to a waits: on a's connection to b (the
		// answers' way back) and on b's connection to a.
		c.proxies[a][b].hold(1, true)
		c.proxies[b][a].hold(0, true)
		time.Sleep(1200 * time.Millisecond) // the fault: a 1.2 s stall, past the append's 1 s wait (and within what a lease survives)
		c.proxies[a][b].hold(1, false)
		c.proxies[b][a].hold(0, false)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if after := strings.Count(c.nodes[a].stderr.String(), "an append's answer was lost"); after > before {
				c.record("a lost answer to an append", 0)
				c.t.Logf("answers from %s to %s held 1.2 s during a turn in %s: %d append(s) resolved", leader, node, rm, after-before)
				return
			}
			time.Sleep(100 * time.Millisecond) // polling the node's log: no event tells
		}
	}
	c.t.Errorf("no append of a holder lost its answer in 5 tries (the fault was not injected)")
}

// waitTurnOf follows rm until the turn of the message labelled label
// starts.
func (c *chaosRun) waitTurnOf(ctx context.Context, rm, label string) {
	c.t.Helper()
	var id string
	for ctx.Err() == nil {
		base := c.live("")
		err := chaosEvents(ctx, base, c.token, rm, 0, true, func(typ string, raw []byte) (bool, error) {
			var d struct {
				MessageID string `json:"message_id"`
				Text      string
			}
			_ = json.Unmarshal(raw, &d)
			switch {
			case typ == "message.accepted" && strings.HasSuffix(d.Text, " "+label):
				id = d.MessageID
			case typ == "turn.started" && id != "" && d.MessageID == id:
				return true, nil
			}
			return false, nil
		})
		if err == nil {
			return
		}
	}
	c.t.Fatalf("the turn of %s never started", label)
}

// streamLeader is the rooms' log stream's leader ("" while it has none).
func (c *chaosRun) streamLeader(ctx context.Context, js jetstream.JetStream) string {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := js.Stream(rctx, natsroom.StreamRooms)
	if err != nil || s.CachedInfo().Cluster == nil {
		return ""
	}
	return s.CachedInfo().Cluster.Leader
}

// fillQueue: a long turn, then a burst of more messages than the queue
// holds, through every node at once: each is answered 202 (and then runs,
// or is refused with an outcome) or 429.
func (c *chaosRun) fillQueue(ctx context.Context, rm string) {
	c.post(ctx, rm, "work 2000 "+c.label(rm, "long"))
	var wg sync.WaitGroup
	for range 72 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.post(ctx, rm, "work 5 "+c.label(rm, "burst"))
		}()
	}
	wg.Wait()
	c.record("a full queue", 0)
	c.mu.Lock()
	c.t.Logf("a burst of 72 into %s behind a long turn: %d refused with 429 so far", rm, c.refused)
	c.mu.Unlock()
}

// restartAll: kill -9 of every node with rooms mid-turn and queued, then
// all start again; the rooms resume without a new message.
func (c *chaosRun) restartAll(ctx context.Context, rooms []string) {
	c.busyRoom(ctx, rooms, -1)
	at := time.Now()
	for i := range c.nodes {
		c.kill(i)
	}
	c.record("a whole-cluster restart", 0)
	if err := c.startNodes(ctx, 0, 1, 2); err != nil {
		c.t.Fatal(err)
	}
	c.hit("a whole-cluster restart", at, c.nodes[0].name, c.nodes[1].name, c.nodes[2].name)
	c.t.Logf("the whole cluster was killed and started again")
}

// leadStreams makes node i lead the rooms' log and the lease bucket (a
// step-down asking for it, a few times: placement is a preference).
func (c *chaosRun) leadStreams(ctx context.Context, js jetstream.JetStream, i int) {
	for _, stream := range []string{natsroom.StreamRooms, "KV_" + natsroom.BucketLease} {
		for try := 0; try < 5 && ctx.Err() == nil; try++ {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			st, err := js.Stream(rctx, stream)
			cancel()
			if err == nil && st.CachedInfo().Cluster != nil && st.CachedInfo().Cluster.Leader == c.nodes[i].name {
				break
			}
			req, _ := json.Marshal(map[string]any{"placement": map[string]any{"preferred": c.nodes[i].name}})
			rctx, cancel = context.WithTimeout(ctx, 5*time.Second)
			_, _ = c.nc.RequestWithContext(rctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, req)
			cancel()
			time.Sleep(time.Second) // the election it asked for: no event to wait on
		}
	}
}

// streamsLed is the nodes leading the rooms' log and the lease bucket.
func (c *chaosRun) streamsLed(ctx context.Context, js jetstream.JetStream) (rooms, lease string) {
	leader := func(stream string) string {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := js.Stream(rctx, stream)
		if err != nil || st.CachedInfo().Cluster == nil {
			return ""
		}
		return st.CachedInfo().Cluster.Leader
	}
	return leader(natsroom.StreamRooms), leader("KV_" + natsroom.BucketLease)
}

// via is JetStream through node i alone (a node cut off answers from its
// own stale view); done closes it.
func (c *chaosRun) via(i int) (js jetstream.JetStream, done func()) {
	nc, err := nats.Connect(c.nodes[i].natsURL, c.auth, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		c.t.Fatalf("connecting to %s: %v", c.nodes[i].name, err)
	}
	js, _ = jetstream.New(nc)
	return js, nc.Close
}

// waitLeaders waits until the log and the lease bucket have leaders other
// than not (as js, through a node of the majority, sees them), and
// returns how long it took from since.
func (c *chaosRun) waitLeaders(ctx context.Context, js jetstream.JetStream, not string, since time.Time) time.Duration {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for wctx.Err() == nil {
		r, l := c.streamsLed(wctx, js)
		if r != "" && l != "" && r != not && l != not {
			return time.Since(since)
		}
		time.Sleep(250 * time.Millisecond) // an election: polled
	}
	c.t.Fatalf("no new leaders of the streams in 2 min (the old: %s): %s", not, c.clusterInfo(ctx, js))
	return 0
}

// chaosStreams are the cluster's streams and buckets.
var chaosStreams = []string{natsroom.StreamRooms, natsroom.StreamWake, "KV_" + natsroom.BucketLease, "KV_" + natsroom.BucketLoad,
	"KV_" + natsroom.BucketWork, "KV_" + natsroom.BucketSettings}

// clusterInfo says, for a failure, each stream's leader and replicas.
func (c *chaosRun) clusterInfo(ctx context.Context, js jetstream.JetStream) string {
	var b strings.Builder
	for _, stream := range chaosStreams {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := js.Stream(rctx, stream)
		cancel()
		if err != nil {
			fmt.Fprintf(&b, "%s: %v; ", stream, err)
			continue
		}
		ci, _ := json.Marshal(st.CachedInfo().Cluster)
		fmt.Fprintf(&b, "%s: %s; ", stream, ci)
	}
	return b.String()
}

// waitAllCurrent waits until every stream has a leader and every replica
// is current: a node started again holds no replica of the buckets kept in
// memory until it caught up, and one more fault before that (its peer's
// loss) leaves them no quorum (NATS counts no empty replica's vote).
// Each fault of the checker is one at a time, as an R3 cluster tolerates.
func (c *chaosRun) waitAllCurrent(ctx context.Context, js jetstream.JetStream) time.Duration {
	began := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for wctx.Err() == nil {
		current := true
		for _, stream := range chaosStreams {
			rctx, cancel := context.WithTimeout(wctx, 5*time.Second)
			st, err := js.Stream(rctx, stream)
			cancel()
			var ci *jetstream.ClusterInfo
			if err == nil {
				ci = st.CachedInfo().Cluster
			}
			current = current && ci != nil && ci.Leader != "" && len(ci.Replicas) == 2
			if ci != nil {
				for _, r := range ci.Replicas {
					current = current && r.Current && !r.Offline
				}
			}
			if !current {
				break
			}
		}
		if current {
			return time.Since(began)
		}
		time.Sleep(250 * time.Millisecond) // replicas catching up: polled
	}
	c.t.Fatalf("the streams' replicas not all current in 2 min: %s", c.clusterInfo(ctx, js))
	return 0
}

// killStreamLeader: kill -9 of the node that leads the rooms' log and the
// lease bucket, whatever rooms it holds; every other node's rooms must
// wait out the elections (a pause, not a turn). The node starts again.
func (c *chaosRun) killStreamLeader(ctx context.Context) {
	js, _ := jetstream.New(c.nc)
	c.waitAllCurrent(ctx, js)
	leader, _ := c.streamsLed(ctx, js)
	i := slices.IndexFunc(c.nodes[:], func(n *chaosNode) bool { return n.name == leader })
	if i < 0 {
		c.t.Fatalf("the rooms' log has no leader (%q)", leader)
	}
	c.leadStreams(ctx, js, i)
	r, l := c.streamsLed(ctx, js)
	other, done := c.via((i + 1) % 3)
	defer done()
	at := time.Now()
	c.kill(i)
	took := c.waitLeaders(ctx, other, c.nodes[i].name, at)
	c.record("kill -9 of the node leading the log and the lease bucket", 0)
	c.mu.Lock()
	c.elections = append(c.elections, took)
	c.mu.Unlock()
	c.t.Logf("kill -9 of %s (leading the log: %s, the lease bucket: %s): new leaders in %v", c.nodes[i].name, r, l, took.Round(time.Millisecond))
	if err := c.startNodes(ctx, i); err != nil {
		c.t.Fatal(err)
	}
	c.hit("kill -9 of the streams' leader", at, c.nodes[i].name)
}

// partitionHealed: the node leading the log and the lease bucket is cut
// off (its routes reset) for d, then heard again: at the heal its raised
// raft terms make every leader step down. Only its own rooms may lose a
// turn (they move while it is cut off); its API stays up, and a message
// posted through it is answered 202, 429 or 503, never 500.
func (c *chaosRun) partitionHealed(ctx context.Context, d time.Duration) {
	js, _ := jetstream.New(c.nc)
	c.t.Logf("every stream's replicas current after %v", c.waitAllCurrent(ctx, js).Round(time.Millisecond))
	leader, _ := c.streamsLed(ctx, js)
	i := slices.IndexFunc(c.nodes[:], func(n *chaosNode) bool { return n.name == leader })
	if i < 0 {
		c.t.Fatalf("the rooms' log has no leader (%q)", leader)
	}
	c.leadStreams(ctx, js, i)
	cut := func(on bool) {
		for j := range c.nodes {
			if j != i {
				c.proxies[i][j].cut(on)
				c.proxies[j][i].cut(on)
			}
		}
	}
	other, done := c.via((i + 1) % 3)
	defer done()
	at := time.Now()
	cut(true)
	took := c.waitLeaders(ctx, other, c.nodes[i].name, at)
	time.Sleep(max(0, d-time.Since(at))) // the partition's length: the fault itself
	cut(false)
	healed := time.Now()
	// Every stream's replicas current again (the heal's elections done).
	c.waitAllCurrent(ctx, other)
	c.record("a partition of the streams' leader, healed", 0)
	c.mu.Lock()
	c.elections = append(c.elections, took)
	c.mu.Unlock()
	c.t.Logf("%s cut off for %v: new leaders in %v; every replica current %v after the heal", c.nodes[i].name, d, took.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	// (Healed, the node finds it lost its rooms, and drops them.)
	c.hitUntil("a partition healed", at, time.Now().Add(10*time.Second), c.nodes[i].name)
}

// fillDisk: the data dir every node shares (its JetStream stores too: a
// tmpfs here) fills up, and every node's JetStream is disabled; each says
// so in /healthz (503) and /metrics; then the space is freed, and every
// node restarts its JetStream by itself (no restart by hand). It needs
// root (the tmpfs); without, it says so and is not injected.
func (c *chaosRun) fillDisk(ctx context.Context) {
	if !c.tmpfs {
		c.t.Logf("a full disk: not injected (the data dir is not a tmpfs of the test's own: it needs root)")
		return
	}
	js, _ := jetstream.New(c.nc)
	c.waitAllCurrent(ctx, js)
	filler := filepath.Join(c.data, "filler")
	at := time.Now()
	f, err := os.Create(filler)
	if err != nil {
		c.t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				c.t.Fatal(err)
			}
			break
		}
	}
	_ = f.Close()
	// The traffic's writes meet the full disk; every node says so.
	health := func(n *chaosNode) (int, string) {
		code, b, err := c.do(ctx, "GET", n.url+"healthz", "")
		if err != nil {
			return 0, err.Error()
		}
		return code, string(b)
	}
	for _, n := range c.nodes {
		for ctx.Err() == nil {
			if code, body := health(n); code == http.StatusServiceUnavailable && strings.Contains(body, "JetStream is disabled") {
				break
			}
			time.Sleep(250 * time.Millisecond) // the node's watch: polled
		}
		if _, b, err := c.do(ctx, "GET", n.url+"metrics", ""); err != nil || !strings.Contains(string(b), "agenthost_nats_jetstream_enabled 0") {
			c.t.Errorf("%s's /metrics while its JetStream is disabled: %v, no agenthost_nats_jetstream_enabled 0", n.name, err)
		}
	}
	full := time.Since(at)
	if err := os.Remove(filler); err != nil {
		c.t.Fatal(err)
	}
	freed := time.Now()
	for _, n := range c.nodes {
		for ctx.Err() == nil {
			if code, _ := health(n); code == http.StatusOK {
				break
			}
			time.Sleep(250 * time.Millisecond) // the node's watch: polled
		}
		_, b, err := c.do(ctx, "GET", n.url+"metrics", "")
		if err != nil || !strings.Contains(string(b), "agenthost_nats_jetstream_enabled 1") {
			c.t.Errorf("%s's /metrics once its JetStream runs again: %v, no agenthost_nats_jetstream_enabled 1", n.name, err)
		}
		// A step of the restart that passed its deadline was retried (the
		// node is back): told, not failed.
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "agenthost_nats_restart_stalls_total "); ok && v != "0" {
				c.t.Logf("%s: %s step(s) of its restart in place passed their deadline (its log names them)", n.name, v)
			}
		}
	}
	c.record("a full disk, then freed", 0)
	c.t.Logf("a full disk: every node's JetStream disabled %v after it filled; every node healthy %v after it was freed", full.Round(time.Millisecond), time.Since(freed).Round(time.Millisecond))
	// (Every node's rooms lost their leases: their turns end failed once
	// placed again.)
	c.hitUntil("a full disk", at, time.Now().Add(30*time.Second), c.nodes[0].name, c.nodes[1].name, c.nodes[2].name)
}

// label names a fault's message in rm, once in the run.
func (c *chaosRun) label(rm, kind string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.labels++
	return fmt.Sprintf("%s#%s%d", rm, kind, c.labels)
}

func (c *chaosRun) record(fault string, failover time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults[fault]++
	if failover > 0 {
		c.failover = append(c.failover, failover)
	}
}

// journalLine is one line of the agents' journal.
type journalLine struct {
	kind, node string
	pid        int
	room       string
	label      string
	at         int64
}

func (c *chaosRun) readJournal() []journalLine {
	c.t.Helper()
	b, err := os.ReadFile(c.journal)
	if err != nil {
		c.t.Fatal(err)
	}
	var out []journalLine
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 5 {
			c.t.Fatalf("journal line %q", l)
		}
		pid, _ := strconv.Atoi(f[2])
		at, _ := strconv.ParseInt(f[4], 10, 64)
		rm, _, _ := strings.Cut(f[3], "#")
		out = append(out, journalLine{kind: f[0], node: f[1], pid: pid, room: rm, label: f[3], at: at})
	}
	return out
}

// checkAll waits for every promised message to end, then checks the
// invariants and logs the figures.
func (c *chaosRun) checkAll(ctx context.Context, rooms []string) {
	t := c.t
	t.Helper()
	type view struct {
		ID, Text, Status, Outcome, Reason string
		Seq                               int64
	}
	byRoom := map[string][]sentMsg{}
	for _, s := range c.sent {
		byRoom[s.room] = append(byRoom[s.room], s)
	}
	// 1. Every 202 ends exactly once (the API: one record, ended).
	records := map[string]map[string]view{}
	for _, rm := range rooms {
		for {
			var all []view
			var after int64
			u := c.live("")
			ok := true
			for {
				code, b, err := c.do(ctx, "GET", fmt.Sprintf("%sv1/rooms/%s/messages?after=%d&limit=1000", u, rm, after), "")
				if err != nil || code != http.StatusOK {
					ok = false
					break
				}
				var page struct{ Messages []view }
				_ = json.Unmarshal(b, &page)
				all = append(all, page.Messages...)
				if len(page.Messages) < 1000 {
					break
				}
				after = page.Messages[len(page.Messages)-1].Seq
			}
			recs := map[string]view{}
			open := 0
			for _, m := range all {
				if _, dup := recs[m.ID]; dup {
					t.Errorf("room %s: message %s recorded twice", rm, m.ID)
				}
				recs[m.ID] = m
				if m.Status != "ended" {
					open++
				}
			}
			missing := 0
			for _, s := range byRoom[rm] {
				if recs[s.id].Status != "ended" {
					missing++
				}
			}
			if ok && missing == 0 && open == 0 {
				records[rm] = recs
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("room %s: %d answered messages never ended (%d open)", rm, missing, open)
			case <-time.After(500 * time.Millisecond): // polling the rooms until their queues drain
			}
		}
	}
	t.Logf("every answered message ended")
	outcomes := map[string]int{}
	for _, rm := range rooms {
		for _, s := range byRoom[rm] {
			m := records[rm][s.id]
			if m.Outcome == "" {
				t.Errorf("message %s ended without an outcome", s.id)
			}
			if !strings.Contains(m.Text, s.label+"") {
				t.Errorf("message %s: text %q, want the label %s", s.id, m.Text, s.label)
			}
			key := m.Outcome
			if m.Reason != "" {
				key += ": " + m.Reason
			}
			outcomes[key]++
		}
	}
	// 2. The log through every node: contiguous, identical, and each
	// message accepted once and ended at most once per kind.
	seqOf := map[string]int64{} // label -> message.accepted seq
	turnOrder := map[string][]int64{}
	failedTurns, collateral := 0, 0
	replayVia := func(n *chaosNode, rm string) []string {
		var evs []string
		if err := chaosEvents(ctx, n.url, c.token, rm, 0, false, func(typ string, raw []byte) (bool, error) {
			evs = append(evs, string(raw))
			return false, nil
		}); err != nil {
			t.Fatalf("replaying %s through %s: %v", rm, n.name, err)
		}
		return evs
	}
	for _, rm := range rooms {
		// Through the first node, then through each other one until it
		// has as much (a replica may be a write behind), the same.
		first := replayVia(c.nodes[0], rm)
		for _, n := range c.nodes[1:] {
			evs := replayVia(n, rm)
			for len(evs) < len(first) && ctx.Err() == nil {
				time.Sleep(200 * time.Millisecond) // a replica catching up: polled
				evs = replayVia(n, rm)
			}
			if len(evs) < len(first) || strings.Join(evs[:len(first)], "\n") != strings.Join(first, "\n") {
				t.Errorf("room %s replays differently through %s and %s", rm, n.name, c.nodes[0].name)
			}
		}
		accepted, turnEnded, msgEnded := map[string]int{}, map[string]int{}, map[string]int{}
		holder := ""                     // the node of the last takeover
		turnOn := map[string]string{}    // turn id -> the node it ran on
		turnAt := map[string]time.Time{} // turn id -> its start
		for i, raw := range first {
			var e struct {
				Seq       int64
				Type      string
				Time      time.Time
				MessageID string `json:"message_id"`
				TurnID    string `json:"turn_id"`
				Node      string
				Outcome   string
				Reason    string
				Text      string
			}
			_ = json.Unmarshal([]byte(raw), &e)
			if e.Seq != int64(i+1) {
				t.Fatalf("room %s: event %d has seq %d", rm, i, e.Seq)
			}
			switch e.Type {
			case "takeover":
				holder = e.Node
			case "turn.started":
				turnOn[e.TurnID], turnAt[e.TurnID] = holder, e.Time
			}
			if e.Type == "turn.ended" && e.Outcome == "failed" {
				// 5. A turn fails only where a fault hit its node.
				failedTurns++
				if !c.faultHit(turnOn[e.TurnID], turnAt[e.TurnID], e.Time) {
					collateral++
					t.Errorf("room %s: turn %s on %s (%s to %s) failed (%s), and no fault hit %s then",
						rm, e.TurnID, turnOn[e.TurnID], turnAt[e.TurnID].Format("15:04:05.000"), e.Time.Format("15:04:05.000"), e.Reason, turnOn[e.TurnID])
				}
			}
			switch e.Type {
			case "message.accepted":
				accepted[e.MessageID]++
				if f := strings.Fields(e.Text); len(f) == 3 {
					seqOf[f[2]] = e.Seq
				}
			case "turn.started":
				// (A message posted as the traffic stopped, its answer
				// never read, may run after the records were read: no
				// promise was made for it.)
				if m, ok := records[rm][e.MessageID]; ok {
					turnOrder[rm] = append(turnOrder[rm], m.Seq)
				}
			case "turn.ended":
				turnEnded[e.MessageID]++
			case "message.ended":
				msgEnded[e.MessageID]++
			}
		}
		for _, s := range byRoom[rm] {
			if accepted[s.id] != 1 || turnEnded[s.id] > 1 || msgEnded[s.id] > 1 {
				t.Errorf("room %s, message %s: accepted %d times, %d turn ends, %d message ends", rm, s.id, accepted[s.id], turnEnded[s.id], msgEnded[s.id])
			}
		}
		// 3. Order: turns start in the order their messages were accepted.
		if !sort.SliceIsSorted(turnOrder[rm], func(i, j int) bool { return turnOrder[rm][i] < turnOrder[rm][j] }) {
			t.Errorf("room %s: turns started out of acceptance order: %v", rm, turnOrder[rm])
		}
	}
	// 4. The agents' journal: per room, the turns in acceptance order,
	// and no two turns (on any agents, any nodes) at once.
	type span struct {
		label, node string
		pid         int
		start, last int64
	}
	spans := map[string]*span{}
	var order []string
	for _, l := range c.readJournal() {
		key := l.label + "/" + strconv.Itoa(l.pid)
		s := spans[key]
		if s == nil {
			s = &span{label: l.label, node: l.node, pid: l.pid, start: l.at}
			spans[key] = s
			order = append(order, key)
		}
		s.last = max(s.last, l.at)
	}
	// The agents of a paused holder: how long after the pause they still
	// worked (their fuse freezes them at the holder's lease deadline).
	var frozeAfter time.Duration
	for _, s := range spans {
		if at, ok := c.paused[s.label]; ok {
			frozeAfter = max(frozeAfter, time.Duration(s.last-at.UnixNano()))
		}
	}
	perRoom := map[string][]*span{}
	for _, k := range order {
		s := spans[k]
		rm, _, _ := strings.Cut(s.label, "#")
		perRoom[rm] = append(perRoom[rm], s)
	}
	var maxOverlap time.Duration
	minGap := time.Duration(-1) // between agents of different nodes, one after another
	overlaps := 0
	for rm, ss := range perRoom {
		sort.Slice(ss, func(i, j int) bool { return ss[i].start < ss[j].start })
		var seqs []int64
		for i, s := range ss {
			seqs = append(seqs, seqOf[s.label])
			if i == 0 {
				continue
			}
			prev := ss[i-1]
			if d := time.Duration(prev.last - s.start); d > 0 {
				overlaps++
				maxOverlap = max(maxOverlap, d)
				t.Errorf("room %s: turn %s (%s pid %d) started %v before turn %s (%s pid %d) stopped", rm, s.label, s.node, s.pid, d, prev.label, prev.node, prev.pid)
			} else if prev.node != s.node {
				if gap := time.Duration(s.start - prev.last); minGap < 0 || gap < minGap {
					minGap = gap
				}
			}
		}
		if !sort.SliceIsSorted(seqs, func(i, j int) bool { return seqs[i] < seqs[j] }) {
			t.Errorf("room %s: the agents ran turns out of acceptance order: %v", rm, seqs)
		}
	}
	// Figures.
	c.mu.Lock()
	defer c.mu.Unlock()
	fo := slices.Clone(c.failover)
	slices.Sort(fo)
	pct := func(p float64) time.Duration { // nearest rank
		if len(fo) == 0 {
			return 0
		}
		return fo[max(0, int(math.Ceil(p*float64(len(fo))))-1)].Round(time.Millisecond)
	}
	var faults []string
	for f, n := range c.faults {
		faults = append(faults, fmt.Sprintf("%s x%d", f, n))
	}
	sort.Strings(faults)
	t.Logf("chaos: %d rooms; %d messages answered 202, %d refused 429, %d unanswered (node down); outcomes %v", len(rooms), len(c.sent), c.refused, c.unknown, outcomes)
	t.Logf("chaos: faults injected: %s", strings.Join(faults, ", "))
	t.Logf("chaos: failover (fault to the new holder's takeover) over %d: p50 %v, p99 %v, max %v; event streams through a survivor that failed during a failover: %d", len(fo), pct(0.5), pct(0.99), pct(1), c.streamErrs)
	t.Logf("chaos: the agents' journal: %d turns; overlapping turns of a room: %d (max overlap %v); least gap between two nodes' agents of a room: %v",
		len(spans), overlaps, maxOverlap, minGap.Round(time.Millisecond))
	t.Logf("chaos: a paused holder's agent worked on at most %v after the pause (frozen at the holder's lease deadline: 3 s lease - 0.5 s margin after its last renewal)", frozeAfter.Round(time.Millisecond))
	if len(c.elections) > 0 {
		el := slices.Clone(c.elections)
		slices.Sort(el)
		t.Logf("chaos: new leaders of the log and the lease bucket after their leader's loss, over %d: p50 %v, max %v", len(el), el[(len(el)-1)/2].Round(time.Millisecond), el[len(el)-1].Round(time.Millisecond))
	}
	t.Logf("chaos: turns that ended failed: %d; of them in rooms whose holder no fault hit: %d (goal: none)", failedTurns, collateral)
	if c.streamErrs > 0 {
		t.Errorf("%d event streams through a surviving node failed during a failover (they must open and replay while the room has no holder)", c.streamErrs)
	}
}

// faultHit reports whether a fault hit node while a turn ran on it (from
// start to end): a turn it held then may fail.
func (c *chaosRun) faultHit(node string, start, end time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.windows {
		if w.nodes[node] && !start.After(w.to) && !end.Before(w.from) {
			return true
		}
	}
	return false
}

// chaosEvents reads rm's events through the node at base, on one
// connection: a stream that breaks is an error (the checker then picks a
// live node), not a reconnect to the same node.
func chaosEvents(ctx context.Context, base, token, rm string, after int64, follow bool, fn func(typ string, raw []byte) (bool, error)) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	cl, err := client.New(base, client.Options{Token: token, OnReconnect: func(r client.Reconnect) {
		if r.Err != nil {
			cancel(r.Err)
		}
	}})
	if err != nil {
		return err
	}
	events := cl.Events
	if follow {
		events = cl.Follow
	}
	for ev, err := range events(ctx, rm, after) {
		if err != nil {
			if cause := context.Cause(ctx); cause != nil {
				return cause
			}
			return err
		}
		if done, err := fn(ev.Type, ev.Data); done || err != nil {
			return err
		}
	}
	return context.Cause(ctx)
}
