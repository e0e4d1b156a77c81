//go:build linux

package procd

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An accept error (EMFILE: the daemon out of descriptors) is waited out:
// once descriptors are free again the daemon answers. (Its accept loop
// ended on the first error: the daemon held the data dir and never
// answered again.)
func TestDaemon_AcceptErrorWaitedOut(t *testing.T) {
	const limit = 32
	dir, c := startDaemon(t, "--nofile", strconv.Itoa(limit))
	fds := func() int {
		ents, _ := os.ReadDir("/proc/" + strconv.Itoa(c.PID()) + "/fd")
		return len(ents)
	}
	svc, err := readService(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Idle connections (each holds one of the daemon's descriptors until
	// its first frame or its close) until accept fails.
	var conns []net.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	for range limit + 8 {
		nc, err := net.Dial("unix", svc.Socket)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
	}
	waitFor(t, "the daemon to run out of descriptors", func() bool { return fds() >= limit })
	for _, nc := range conns {
		nc.Close()
	}
	conns = nil
	if err := c.Ping(testCtx(t)); err != nil {
		t.Fatalf("the daemon does not answer after running out of descriptors: %v", err)
	}
}

// A data dir too deep for a socket path puts the socket in a private temp
// dir; a daemon killed with SIGKILL leaves it, and the next daemon of the
// data dir removes it. (One leaked per killed daemon.)
func TestDaemon_DeepDataDirTempSocketSwept(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	ctx := testCtx(t)
	c, err := Connect(ctx, dir, testOpts())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopDaemon(t, dir) })
	sock := filepath.Dir(c.service().Socket)
	if !strings.HasPrefix(filepath.Base(sock), tempSockPrefix) {
		t.Fatalf("socket %s: want it in a temp dir", c.service().Socket)
	}
	if err := syscall.Kill(c.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the killed daemon's lock to be free", func() bool {
		free, _ := lockFree(dir)
		return free
	})
	c2, err := Connect(ctx, dir, testOpts())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the killed daemon's socket dir %s is still there (%v)", sock, err)
	}
	if filepath.Dir(c2.service().Socket) == sock {
		t.Fatal("the new daemon reused the old socket dir")
	}
}

// list pages its reply: processes whose metadata add up to more than a
// frame are all listed, oldest first (the one reply outgrew the 8 MiB
// frame and list failed for good). Some seconds under -race: 8 MiB of
// metadata is encoded and decoded on both sides.
func TestList_Paged(t *testing.T) {
	_, c := startDaemon(t)
	// CPU-bound, not waiting: about ten encodings of each megabyte, which
	// under -race on a loaded 2-core box take a minute.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	meta := json.RawMessage(`{"blob":"` + strings.Repeat("x", MaxMetadata-20) + `"}`)
	var ids []string
	for range 8 {
		spec := pipeSpec(t, "exec cat") // ends at the shutdown's stdin close
		spec.Metadata = meta
		info, err := c.CreatePipe(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	ps, err := c.List(ctx, ModePipe)
	if err != nil {
		t.Fatalf("list of %d processes with %d bytes of metadata each: %v", len(ids), len(meta), err)
	}
	if len(ps) != len(ids) {
		t.Fatalf("listed %d processes, want %d", len(ps), len(ids))
	}
	for i, p := range ps {
		if p.ID != ids[i] || len(p.Metadata) != len(meta) {
			t.Fatalf("process %d: %s with %d bytes of metadata; want %s, oldest first", i, p.ID, len(p.Metadata), ids[i])
		}
	}
}

// trim releases the blocks of a running pipe process's output before an
// offset: the file keeps its size and every offset, what follows reads
// as before, and the disk it takes shrinks. (Output files grew for as
// long as the process ran.)
func TestPipe_Trim(t *testing.T) {
	_, c := startDaemon(t)
	ctx := testCtx(t)
	const big = 4 << 20
	spec := pipeSpec(t, "yes 0123456789abcdef | head -c 4194304; echo tail-marker; exec cat")
	info, err := c.CreatePipe(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(big + len("tail-marker\n"))
	waitFor(t, "the output", func() bool {
		pi, err := c.Get(ctx, info.ID)
		return err == nil && pi.Pipe.OutputBytes == want
	})
	used := func() int64 {
		var st syscall.Stat_t
		if err := syscall.Stat(spec.OutputPath, &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != want {
			t.Fatalf("output file size %d, want %d (kept)", st.Size, want)
		}
		return st.Blocks * 512
	}
	before := used()
	if err := c.Trim(ctx, info.ID, big+1, 0); err != nil {
		t.Fatal(err)
	}
	after := used()
	if after > before-big+64<<10 {
		t.Fatalf("the file takes %d bytes on disk after trimming %d of it (before: %d)", after, big, before)
	}
	f, err := os.Open(spec.OutputPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tail := make([]byte, len("tail-marker\n"))
	if _, err := f.ReadAt(tail, big); err != nil || string(tail) != "tail-marker\n" {
		t.Fatalf("after the trimmed range: %q %v", tail, err)
	}
	if pi, err := c.Get(ctx, info.ID); err != nil || pi.Pipe.OutputTrimmed != big {
		t.Fatalf("output_trimmed: %+v %v", pi.Pipe, err)
	}
	// Past what was written, and again: nothing more, no error.
	if err := c.Trim(ctx, info.ID, 1<<40, 1<<40); err != nil {
		t.Fatal(err)
	}
	if pi, err := c.Get(ctx, info.ID); err != nil || pi.Pipe.OutputTrimmed != want-want%trimAlign {
		t.Fatalf("output_trimmed: %+v %v", pi.Pipe, err)
	}
}
