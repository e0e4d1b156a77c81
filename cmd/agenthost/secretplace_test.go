package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCheckSecretPlaces: a cluster secret (or --nats-creds) where confined
// agents may read it (the system's folders, through a link too, the
// workspaces, or a data dir under /opt) is refused, naming the folder and
// where it belongs; the default in a private data dir, or a file of the
// server's own elsewhere, is taken. An agent that read one under /etc
// joined the cluster and wrote into another room with no API token.
func TestCheckSecretPlaces(t *testing.T) {
	data := t.TempDir()
	own := t.TempDir()
	link := filepath.Join(own, "to-etc")
	if err := os.Symlink("/etc/hostname", link); err != nil {
		t.Fatal(err)
	}
	base := serveFlags{natsEmbedded: true, data: data, workspaces: filepath.Join(data, "workspaces")}
	for _, c := range []struct {
		name   string
		edit   func(f *serveFlags)
		refuse string // the folder named, "" to take it
	}{
		{"the default, in the data dir", func(f *serveFlags) {}, ""},
		{"a file of the server's own", func(f *serveFlags) { f.natsSecretFile = filepath.Join(own, "secret") }, ""},
		{"under /etc", func(f *serveFlags) { f.natsSecretFile = "/etc/agenthost-cluster-secret" }, "/etc"},
		{"under /opt", func(f *serveFlags) { f.natsSecretFile = "/opt/agenthost/secret" }, "/opt"},
		{"a link into /etc", func(f *serveFlags) { f.natsSecretFile = link }, "/etc"},
		{"in the workspaces", func(f *serveFlags) { f.natsSecretFile = filepath.Join(f.workspaces, "room", "secret") }, filepath.Join(data, "workspaces")},
		{"a data dir under /opt", func(f *serveFlags) { f.data = "/opt/agenthost-data"; f.workspaces = "/opt/agenthost-data/workspaces" }, "/opt"},
		{"--nats-creds under /usr", func(f *serveFlags) {
			f.natsEmbedded, f.nats, f.natsCreds = false, []string{"nats://x:4222"}, "/usr/local/etc/nats.creds"
		}, "/usr"},
	} {
		f := base
		c.edit(&f)
		err := checkSecretPlaces(f)
		switch {
		case c.refuse == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.refuse != "" && (err == nil || !strings.Contains(err.Error(), "lies in "+c.refuse+",") || !strings.Contains(err.Error(), "data dir")):
			t.Errorf("%s: %v; want it refused naming %s and saying where it belongs", c.name, err, c.refuse)
		}
	}
}

// TestServe_SecretWhereAgentsReadItRefused: serve refuses to start, at
// once and exit status 2, with a --nats-secret-file under /etc.
func TestServe_SecretWhereAgentsReadItRefused(t *testing.T) {
	p := startServeProc(t, "tok", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--node", "n1", "--nats-embedded",
		"--nats-secret-file", "/etc/agenthost-cluster-secret")
	p.waitExit(t, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.ExitCode() != 2 || !strings.Contains(p.stderr.String(), "which the rooms' agents may read") {
		t.Fatalf("serve with the secret under /etc: %v\n%s", p.err, p.stderr.String())
	}
}
