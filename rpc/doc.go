// Package rpc is a client for the omp and pi coding agents in RPC mode: one
// JSON object per line over the agent's stdin and stdout.
//
// A Client owns one transport (a spawned agent or any reader/writer pair). It
// frames lines (LF only, bounded), reassembles omp protocol v2 chunks, matches
// responses to requests, runs host tools and extension UI dialogs, and hands
// events to listeners through a bounded dispatcher, so a slow listener never
// delays response matching. Every blocking call takes a context; Close
// unblocks every waiter.
package rpc
