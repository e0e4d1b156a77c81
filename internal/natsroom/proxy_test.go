package natsroom

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxy forwards loopback TCP connections to a target; Cut closes the
// live ones and refuses new ones until Heal: a network partition of one
// route direction, without root.
type proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.wg.Add(2)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		go pipe(up, c)
		go pipe(c, up)
	}
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			_ = c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

func (p *proxy) close() {
	_ = p.l.Close()
	p.setCut(true)
	p.wg.Wait()
}

// latencyProxy forwards loopback TCP connections to a target and delays
// what the target sends by the latency set, pipelined (a slow link, not a
// slow server: many answers can be on their way at once).
type latencyProxy struct {
	l      net.Listener
	target string
	d      atomic.Int64 // the latency, in nanoseconds
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newLatencyProxy(t *testing.T, target string) *latencyProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &latencyProxy{l: l, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *latencyProxy) addr() string { return p.l.Addr().String() }

func (p *latencyProxy) setLatency(d time.Duration) { p.d.Store(int64(d)) }

func (p *latencyProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		type chunk struct {
			at time.Time
			b  []byte
		}
		line := make(chan chunk, 4096)
		p.wg.Add(3)
		go func() { // client to target, at once
			defer p.wg.Done()
			_, _ = io.Copy(up, c)
			_ = up.Close()
		}()
		go func() { // target to the line
			defer p.wg.Done()
			defer close(line)
			for {
				b := make([]byte, 32<<10)
				n, err := up.Read(b)
				if n > 0 {
					line <- chunk{time.Now().Add(time.Duration(p.d.Load())), b[:n]}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // the line to the client, each chunk d late
			defer p.wg.Done()
			defer c.Close()
			for ch := range line {
				time.Sleep(time.Until(ch.at)) // the link's latency itself
				if _, err := c.Write(ch.b); err != nil {
					_ = up.Close()
					for range line {
					}
					return
				}
			}
		}()
	}
}

func (p *latencyProxy) close() {
	_ = p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
