package daemonproc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// tail reads a file another process appends to, from an offset, until the
// writer is done: a Read at the end waits for the file to grow (inotify)
// or for done to close (the daemon closes the file before it reports the
// exit), then returns io.EOF once nothing is left. Close ends it.
type tail struct {
	f      *os.File
	ino    *os.File      // the inotify instance, in Go's poller
	grew   chan struct{} // capacity 1: growth since the last Read
	done   <-chan struct{}
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
}

func openTail(path string, offset int64, done <-chan struct{}) (*tail, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("daemonproc: inotify: %w", err)
	}
	ino := os.NewFile(uintptr(fd), "inotify")
	// Watch before the first read: growth after it is never missed.
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY|unix.IN_CLOSE_WRITE); err != nil {
		ino.Close()
		return nil, fmt.Errorf("daemonproc: watching the output: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		ino.Close()
		return nil, fmt.Errorf("daemonproc: the output: %w", err)
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		f.Close()
		ino.Close()
		return nil, fmt.Errorf("daemonproc: the output: %w", err)
	}
	t := &tail{f: f, ino: ino, grew: make(chan struct{}, 1), done: done, closed: make(chan struct{})}
	t.wg.Add(1)
	go t.watch()
	return t, nil
}

// watch turns inotify events into a wake-up; it ends when Close closes
// the instance.
func (t *tail) watch() {
	defer t.wg.Done()
	buf := make([]byte, 4096)
	for {
		if _, err := t.ino.Read(buf); err != nil {
			return
		}
		select {
		case t.grew <- struct{}{}:
		default:
		}
	}
}

func (t *tail) Read(p []byte) (int, error) {
	for {
		select {
		case <-t.closed:
			return 0, os.ErrClosed
		default:
		}
		finished := isClosed(t.done) // before the read: what follows is all there is
		n, err := t.f.Read(p)
		if n > 0 {
			return n, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if finished {
			return 0, io.EOF
		}
		select {
		case <-t.grew:
		case <-t.done:
		case <-t.closed:
			return 0, os.ErrClosed
		}
	}
}

// Close ends a Read in progress and releases the files. Idempotent.
func (t *tail) Close() {
	t.once.Do(func() {
		close(t.closed)
		t.ino.Close()
		t.wg.Wait()
		// A Read may still run on f; closing it makes that Read fail,
		// which is what Close means.
		t.f.Close()
	})
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
	}
	return false
}
