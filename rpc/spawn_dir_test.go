package rpc

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestSpawn_BadDir: a missing or non-directory Spec.Dir is reported as the
// working directory, not as the agent's binary missing.
func TestSpawn_BadDir(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	missing := t.TempDir() + "/gone"
	for _, tt := range []struct {
		dir  string
		want error
	}{{missing, fs.ErrNotExist}, {exe, syscall.ENOTDIR}} {
		spec := fakeSpec(t, "plain")
		spec.Dir = tt.dir
		c, err := Spawn(context.Background(), spec, SpawnOptions{})
		if err == nil {
			c.Close()
			t.Fatalf("dir %s: spawned", tt.dir)
		}
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.dir) || !strings.Contains(err.Error(), "working directory") {
			t.Fatalf("dir %s: err = %v", tt.dir, err)
		}
	}
}

// TestClient_OnEventSeesTheHandshake: Options.OnEvent is in place before
// Start, so it sees the first frame and the handshake's response.
func TestClient_OnEventSeesTheHandshake(t *testing.T) {
	types := make(chan string, 16)
	c, err := Spawn(ctxT(t, 60e9), fakeSpec(t, "plain"), SpawnOptions{Options: Options{OnEvent: func(ev Event) {
		select {
		case types <- ev.Type:
		default:
		}
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := closeAndWait(t, c); err != nil {
		t.Fatal(err)
	}
	if len(types) == 0 || <-types != "response" {
		t.Fatal("the handshake's response did not reach OnEvent")
	}
}
