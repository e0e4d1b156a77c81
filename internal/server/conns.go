package server

import (
	"log"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// HTTPServer returns the http.Server that serves s, with the connection
// timeouts of Options: a client sends its request's headers within
// ReadHeaderTimeout and a body within BodyTimeout, and a keep-alive
// connection idle for IdleTimeout is closed. None of them cuts an event
// stream once it is answered: it is bounded only by WriteTimeout, per
// write. Serve it on Listener(ln), which bounds the connections.
func (s *Server) HTTPServer(errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.opts.ReadHeaderTimeout,
		IdleTimeout:       s.opts.IdleTimeout,
		ErrorLog:          errorLog,
	}
}

// Listener bounds ln to MaxConns open connections: past it, Accept waits
// for one to close (the kernel's backlog holds new ones meanwhile).
func (s *Server) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, s.opts.MaxConns), done: make(chan struct{}), log: s.log}
}

type limitListener struct {
	net.Listener
	sem    chan struct{}
	done   chan struct{}
	once   sync.Once
	log    *slog.Logger
	warned atomic.Int64 // unix seconds of the last warning
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	default:
		if now := time.Now().Unix(); now-l.warned.Load() >= 60 {
			l.warned.Store(now)
			l.log.Warn("server: at the connection limit; new connections wait", "limit", cap(l.sem))
		}
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
