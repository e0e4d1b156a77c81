package daemonproc

import (
	"bufio"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// A tail reads what its file gains and ends at done, with inotify's
// watcher and with the polling one (other systems, or no inotify
// instance left to the user).
func TestTail_GrowthThenEnd(t *testing.T) {
	for _, useInotify := range []bool{true, false} {
		name := map[bool]string{true: "inotify", false: "polling"}[useInotify]
		t.Run(name, func(t *testing.T) {
			w := newWatcher(useInotify)
			defer w.close()
			if got := w.ino != nil; got != useInotify {
				t.Fatalf("inotify %v, want %v", got, useInotify)
			}
			path := filepath.Join(t.TempDir(), "out")
			out, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			if _, err := out.WriteString("skipped\n"); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			tl, err := openTail(w, path, int64(len("skipped\n")), done)
			if err != nil {
				t.Fatal(err)
			}
			defer tl.Close()
			br := bufio.NewReader(tl)
			for _, line := range []string{"one\n", "two\n"} {
				// The read starts first and (most often) waits at the
				// end of the file; the write wakes it.
				type read struct {
					s   string
					err error
				}
				got := make(chan read, 1)
				go func() {
					s, err := br.ReadString('\n')
					got <- read{s, err}
				}()
				if _, err := out.WriteString(line); err != nil {
					t.Fatal(err)
				}
				if r := <-got; r.err != nil || r.s != line {
					t.Fatalf("read %q, %v; want %q", r.s, r.err, line)
				}
			}
			if _, err := out.WriteString("last\n"); err != nil {
				t.Fatal(err)
			}
			close(done) // the writer is done: what is left, then EOF
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "last\n" {
				t.Fatalf("the rest %q, %v", rest, err)
			}
			// Close ends it.
			tl.Close()
			if _, err := tl.Read(make([]byte, 1)); !errors.Is(err, os.ErrClosed) {
				t.Fatalf("read after Close: %v", err)
			}
		})
	}
}
