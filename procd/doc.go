// Package procd is a process daemon and its client: one daemon per data
// dir starts and reaps processes (pipe or pty) through custody, so they
// outlive the host that asked for them, and a planned restart of that host
// loses nothing.
//
// # Finding the daemon
//
// The daemon of a data dir writes DIR/procd/service.json (0600; instance id,
// pid, protocols, socket, token) by temp file and rename while it holds an
// exclusive flock on DIR/procd/service.lock for its whole life, so there is
// never more than one. Its Unix socket lives in a 0700 directory and is
// itself 0600; every request carries the token, and the peer's uid must be
// the daemon's (SO_PEERCRED). Connect starts a daemon when none answers.
//
// # Wire
//
// Frames are a big-endian u32 length and a JSON payload of at most
// MaxFrame bytes. A request is {"token": T, "request": {"op": OP, ...}};
// replies and events are JSON objects with a "type". A plain request has a
// connection of its own and the first frame back is its reply; wait,
// subscribe and own keep their connection. ping is the handshake: its
// reply carries the protocol versions the daemon speaks. An unknown op is
// answered "unsupported request: OP", a bad field "invalid OP request: ...".
//
// # Protocol versions
//
// A client and a daemon each speak a range of protocol versions (this
// build: MinProtocol 8 to Protocol 9; see Versions). ping answers
// {"protocol": oldest, "protocols": {"min", "max"}}, and the client speaks
// the newest version both have, naming it in every envelope ("protocol";
// none means 8). The daemon is what outlives a planned restart, so the new
// client adapts to the old daemon, whichever build is newer, and the
// daemon keeps its processes; a build keeps at least one version of
// overlap with the one before it. A client and a daemon with no version in
// common fail with a *VersionError naming both ranges (ErrProtocol), and
// Own then leaves that daemon, its processes and its ticket alone. A
// daemon refuses a request in a version it does not speak (code
// "protocol"). Protocol 8 daemons and clients, from before negotiation,
// demand protocol 8 exactly: this build's daemon reports 8 as its oldest,
// so they use it, and its clients claim theirs.
//
// # Owners, other clients and the bounds that end processes
//
// At most one client is the owner (Own): the host whose restarts the daemon
// spans. Other clients (the agenthost proc command line) may use every
// request but own and prepare_handoff. What ends processes nobody looks
// after:
//
//   - An owned daemon lives as long as its owner's connection. When it
//     closes without a prepared handoff (the host crashed or stopped), the
//     daemon ends every process (custody receipts) and exits.
//   - An unowned daemon (started by the command line) ends a process no
//     client has named in a request, waited on or subscribed to for
//     Options.Unattended (10 min), and exits once it has no process and no
//     connection for Options.IdleExit (5 s).
//
// # Handoff across a planned restart
//
//  1. The old host calls PrepareHandoff on its owner client: the daemon
//     makes a single-use ticket valid for HandoffTTL (120 s), writes it to
//     DIR/procd/handoff.json (0600), and from then on the owner's
//     connection closing no longer ends anything.
//  2. The old host exits, leaving its processes running.
//  3. The new host calls Own(ctx, DIR): it reads the ticket file and claims
//     the daemon with own{instance_id, ticket}. The ticket is spent; the file
//     is removed.
//  4. If the claim fails (the ticket expired, the daemon is gone or another
//     instance answers), Own shuts the old daemon down (every process ended,
//     with receipts) and starts a fresh one, so the restart itself always
//     succeeds; Claimed and HandoffErr say which happened. A daemon that
//     holds the data dir but does not answer in time is slow, not gone: it
//     is asked again while the ticket is valid. A ticket nobody claims
//     within HandoffTTL makes the daemon end everything and exit on its own.
//
// # A daemon that dies under its owner
//
// The owner's Done closes; Reown owns a fresh daemon (or claims a handed
// over one) with the same Client. Requests made meanwhile that do not name
// a process wait for it within their context (or until Close: ErrClosed);
// those naming a process of the dead daemon fail at once with ErrNoDaemon
// (the process died with it).
//
// # Callbacks and shutdown
//
// The Go packages of agenthost share one contract (README, "Callbacks and
// shutdown"): Close never waits on user code and is safe anywhere, a
// separate Wait joins the callbacks, and every Close returns the first
// one's result. A Client runs no user code, so it needs no Wait: its
// Close releases the owner connection and joins the client's goroutines.
package procd
