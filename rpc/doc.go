// Package rpc is a client for the omp and pi coding agents in RPC mode: one
// JSON object per line over the agent's stdin and stdout.
//
// A Client owns one transport (a spawned agent or any reader/writer pair). It
// frames lines (LF only, bounded), reassembles omp protocol v2 chunks, matches
// responses to requests, runs host tools and extension UI dialogs, and hands
// events to listeners through a bounded dispatcher, so a slow listener never
// delays response matching. Every blocking call takes a context; Close
// unblocks every waiter.
//
// # Callbacks and shutdown
//
// Listeners (On, OnError, Options.OnEvent), host tools and the UI handler
// are callbacks: the client runs them on goroutines of its own. Close ends
// the transport (waiters released with ErrClosed, stdin closed, an owned
// process stopped and reaped, reading stopped) and never waits for a
// callback, so a callback may call it, directly or through a goroutine it
// waits for. Wait joins the callbacks (the events read before Close
// delivered, every goroutine of the client ended) and must not be called
// from one. Every Close returns the first one's result. The other packages
// of agenthost keep the same contract (README, "Callbacks and shutdown").
package rpc
