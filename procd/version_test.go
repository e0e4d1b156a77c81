//go:build linux

package procd

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Version skew: the test binary plays daemons and clients of other builds
// (--protocols, --pre-negotiation; ClientOptions.protocols).

// versionOpts is testOpts for a client of a build that speaks r, starting
// daemons with flags.
func versionOpts(r Range, flags ...string) *ClientOptions {
	o := testOpts(flags...)
	o.protocols = r
	return o
}

// TestVersions_PlannedRestartAcrossProtocols: a planned restart into a
// build of another protocol claims the old daemon, which keeps running
// with its processes; the new client speaks the old daemon's version.
// Before negotiation any other protocol number failed the claim, and the
// restart could not start until the old daemon ended everything.
func TestVersions_PlannedRestartAcrossProtocols(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		flags      []string // the old daemon's build
		old, new   Range    // the clients' builds
		oldV, newV int      // the versions each speaks with the daemon
	}{
		// This build restarted into one whose protocol is newer.
		{"into a newer protocol", nil, Versions(), Range{Protocol, Protocol + 1}, Protocol, Protocol},
		// Rolled back: a newer build's daemon, claimed by this one.
		{"into an older protocol", []string{"--protocols", fmt.Sprintf("%d-%d", Protocol, Protocol+1)}, Range{Protocol, Protocol + 1}, Versions(), Protocol + 1, Protocol},
		// This build restarted into one of protocol 9 (before limits): the
		// older speaks 9 with this daemon.
		{"into protocol 9", nil, Versions(), Range{8, 9}, Protocol, 9},
		// The build before negotiation (protocol 8 alone) restarted into
		// this one.
		{"from before negotiation", []string{"--pre-negotiation"}, Range{8, 8}, Versions(), 8, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			dir := t.TempDir()
			o1, err := Own(ctx, dir, versionOpts(tc.old, tc.flags...))
			if err != nil {
				t.Fatalf("Own (old build): %v", err)
			}
			t.Cleanup(func() {
				o1.Close()
				stopDaemon(t, dir)
			})
			if got := o1.Protocol(); got != tc.oldV {
				t.Fatalf("the old build speaks %d, want %d", got, tc.oldV)
			}
			info, err := o1.CreatePipe(ctx, pipeSpec(t, `while read l; do echo "$l"; done`))
			if err != nil {
				t.Fatal(err)
			}
			if err := o1.Write(ctx, info.ID, []byte("before\n")); err != nil {
				t.Fatal(err)
			}
			if _, err := o1.PrepareHandoff(ctx); err != nil {
				t.Fatal(err)
			}
			o1.Close() // the old host exits for its restart

			o2, err := Own(ctx, dir, versionOpts(tc.new))
			if err != nil {
				t.Fatalf("Own (new build): %v", err)
			}
			defer o2.Close()
			if !o2.Claimed() || o2.HandoffErr() != nil || o2.InstanceID() != o1.InstanceID() {
				t.Fatalf("claimed %v (err %v), instance %s, want the old daemon %s", o2.Claimed(), o2.HandoffErr(), o2.InstanceID(), o1.InstanceID())
			}
			if got := o2.Protocol(); got != tc.newV {
				t.Fatalf("the new build speaks %d, want %d", got, tc.newV)
			}
			// The process ran on and takes the new owner's input.
			if err := o2.Write(ctx, info.ID, []byte("after\n")); err != nil {
				t.Fatal(err)
			}
			if l := outputLines(t, o2, info.ID, 2); l[0] != "before" || l[1] != "after" {
				t.Fatalf("output %q", l)
			}
			if err := o2.Ping(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestVersions_NoCommonVersion: a client and a daemon with no version in
// common fail with a *VersionError naming both ranges, both ways; Own
// leaves the daemon, its processes and its ticket alone, so the build it
// came with still claims it.
func TestVersions_NoCommonVersion(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir, o1 := ownDaemon(t)
	info, err := o1.CreatePipe(ctx, pipeSpec(t, `while read l; do echo "$l"; done`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o1.PrepareHandoff(ctx); err != nil {
		t.Fatal(err)
	}
	o1.Close()

	future := Range{Protocol + 1, Protocol + 2}
	_, err = Own(ctx, dir, versionOpts(future))
	var verr *VersionError
	if !errors.As(err, &verr) || verr.Client != future || verr.Daemon != Versions() || !errors.Is(err, ErrProtocol) {
		t.Fatalf("Own with no version in common: %v, want a VersionError for %v and %v", err, future, Versions())
	}
	for _, s := range []string{Versions().String(), future.String()} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("%q does not name the range %s", err, s)
		}
	}
	if _, err := Connect(ctx, dir, versionOpts(future)); !errors.As(err, &verr) {
		t.Fatalf("Connect with no version in common: %v", err)
	}
	if _, err := os.Stat(filepath.Join(procdDir(dir), ticketFile)); err != nil {
		t.Fatalf("the ticket after a refused claim: %v", err)
	}
	o2, err := Own(ctx, dir, testOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer o2.Close()
	if !o2.Claimed() || o2.InstanceID() != o1.InstanceID() {
		t.Fatalf("this build's claim after the refused one: claimed %v instance %s", o2.Claimed(), o2.InstanceID())
	}
	if got, err := o2.Get(ctx, info.ID); err != nil || !got.Running {
		t.Fatalf("the process after a refused claim: %+v %v", got, err)
	}

	// The other way: a daemon of a build too new for this one.
	newer := Range{Protocol + 1, Protocol + 2}
	dir2 := t.TempDir()
	o3, err := Own(ctx, dir2, versionOpts(newer, "--protocols", newer.String()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		o3.Close() // its owner gone without a handoff, the daemon exits
		if err := waitGone(testCtx(t), dir2); err != nil {
			t.Errorf("daemon not gone: %v", err)
		}
	})
	if _, err := Dial(ctx, dir2); !errors.As(err, &verr) || verr.Client != Versions() || verr.Daemon != newer {
		t.Fatalf("Dial of a daemon too new: %v", err)
	}
}

// TestVersions_Wire: what a client before negotiation reads of this
// build's daemon (protocol 8 in its registration and ping, requests
// without a version taken as 8) and what a request in a version the
// daemon does not speak gets.
func TestVersions_Wire(t *testing.T) {
	t.Parallel()
	dir, _ := startDaemon(t)
	svc, err := readService(dir)
	if err != nil {
		t.Fatal(err)
	}
	if svc.Protocol != 8 || svc.Protocols == nil || *svc.Protocols != Versions() {
		t.Fatalf("registration: protocol %d, protocols %v", svc.Protocol, svc.Protocols)
	}
	pong := rawRequest(t, dir, svc.Token, `{"op":"ping"}`)
	if pong.Type != TypePong || pong.Protocol != 8 || pong.Protocols == nil || *pong.Protocols != Versions() {
		t.Fatalf("ping: %+v", pong)
	}
	// A client before negotiation names no version.
	if r := rawRequest(t, dir, svc.Token, `{"op":"list","mode":"pipe"}`); r.Type != TypeProcesses {
		t.Fatalf("a request without a version: %+v", r)
	}
	for v, want := range map[int]string{8: TypeProcesses, Protocol: TypeProcesses, 7: TypeError, Protocol + 1: TypeError} {
		r := versionedRequest(t, svc, v, `{"op":"list","mode":"pipe"}`)
		if r.Type != want {
			t.Fatalf("a protocol %d request: %+v, want %s", v, r, want)
		}
		if want == TypeError && (r.Code != codeProtocol || !strings.Contains(r.Message, Versions().String())) {
			t.Fatalf("a protocol %d request refused with %+v", v, r)
		}
	}
	// Ping answers whatever the version: it is how a client learns the range.
	if r := versionedRequest(t, svc, Protocol+1, `{"op":"ping"}`); r.Type != TypePong {
		t.Fatalf("ping in protocol %d: %+v", Protocol+1, r)
	}
}

// versionedRequest sends one request naming protocol v on its own
// connection and returns the reply.
func versionedRequest(t *testing.T, svc service, v int, req string) Reply {
	t.Helper()
	conn, err := net.Dial("unix", svc.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := writeFrame(conn, envelope{Token: svc.Token, Protocol: v, Request: json.RawMessage(req)}); err != nil {
		t.Fatal(err)
	}
	b, err := readFrame(conn)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	var r Reply
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}
