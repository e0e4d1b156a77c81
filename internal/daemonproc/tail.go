package daemonproc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// watcher wakes the tails of a host when their files grow. On Linux it is
// one inotify instance for every output file a host tails: one watch per
// file, events dispatched by watch descriptor. The user's inotify
// instances are few (fs.inotify.max_user_instances, 128 by default,
// shared by all of the user's programs); a host that took two per agent
// could not start more than about 60. Where there is no inotify (other
// systems, or none left to this user) it polls: every tail looks again
// every pollEvery.
type watcher struct {
	ino *os.File // the inotify instance, in Go's poller; nil: polling

	mu     sync.Mutex
	byWD   map[int32][]*tail // the tails of each watch (one file may have several)
	nextWD int32             // polling: the next watch's number
	closed chan struct{}     // closed by close: tails stop waiting for growth
	once   sync.Once
	wg     sync.WaitGroup
}

// pollEvery is how often a polling watcher wakes every tail.
const pollEvery = 100 * time.Millisecond

// newWatcher starts a watcher: inotify's when useInotify and this system
// gives an instance, else a polling one.
func newWatcher(useInotify bool) *watcher {
	w := &watcher{byWD: map[int32][]*tail{}, closed: make(chan struct{})}
	if useInotify {
		if ino, err := inotifyInit(); err == nil {
			w.ino = ino
		}
	}
	w.wg.Add(1)
	if w.ino != nil {
		go w.runInotify()
	} else {
		go w.poll()
	}
	return w
}

// add watches path for t; the returned watch descriptor is remove's.
func (w *watcher) add(path string, t *tail) (int32, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if isClosed(w.closed) {
		return 0, os.ErrClosed
	}
	if w.ino == nil {
		w.nextWD++
		w.byWD[w.nextWD] = []*tail{t}
		return w.nextWD, nil
	}
	wd, err := inotifyAdd(w.ino, path)
	if err != nil {
		return 0, err
	}
	w.byWD[wd] = append(w.byWD[wd], t)
	return wd, nil
}

// remove drops t's interest in watch wd; the watch goes with its last tail.
func (w *watcher) remove(wd int32, t *tail) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ts := w.byWD[wd]
	for i, x := range ts {
		if x == t {
			ts = append(ts[:i:i], ts[i+1:]...)
			break
		}
	}
	if len(ts) > 0 {
		w.byWD[wd] = ts
		return
	}
	if _, ok := w.byWD[wd]; !ok {
		return // the kernel dropped it (the file was removed)
	}
	delete(w.byWD, wd)
	if w.ino != nil && !isClosed(w.closed) {
		inotifyRemove(w.ino, wd)
	}
}

// wakeAll wakes every tail (the caller holds w.mu).
func (w *watcher) wakeAll() {
	for _, ts := range w.byWD {
		for _, t := range ts {
			t.wake()
		}
	}
}

// poll wakes every tail every pollEvery until close.
func (w *watcher) poll() {
	defer w.wg.Done()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		select {
		case <-w.closed:
			return
		case <-tick.C:
		}
		w.mu.Lock()
		w.wakeAll()
		w.mu.Unlock()
	}
}

// close ends the watcher; tails still open stop waiting for growth (a
// Read at the end returns os.ErrClosed). Idempotent.
func (w *watcher) close() {
	w.once.Do(func() {
		w.mu.Lock()
		close(w.closed)
		w.mu.Unlock()
		if w.ino != nil {
			w.ino.Close()
		}
		w.wg.Wait()
	})
}

// tail reads a file another process appends to, from an offset, until the
// writer is done: a Read at the end waits for the file to grow (the
// watcher) or for done to close (the daemon closes the file before it
// reports the exit), then returns io.EOF once nothing is left. Close ends
// it.
type tail struct {
	f      *os.File
	w      *watcher
	wd     int32
	grew   chan struct{} // capacity 1: growth since the last Read
	done   <-chan struct{}
	closed chan struct{}
	once   sync.Once
	pos    atomic.Int64 // the offset of the next byte Read returns
}

func openTail(w *watcher, path string, offset int64, done <-chan struct{}) (*tail, error) {
	t := &tail{w: w, grew: make(chan struct{}, 1), done: done, closed: make(chan struct{})}
	// Watch before the first read: growth after it is never missed.
	wd, err := w.add(path, t)
	if err != nil {
		return nil, fmt.Errorf("daemonproc: watching the output: %w", err)
	}
	t.wd = wd
	f, err := os.OpenFile(path, os.O_RDONLY|noFollow, 0)
	if err != nil {
		w.remove(wd, t)
		return nil, fmt.Errorf("daemonproc: the output: %w", err)
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		f.Close()
		w.remove(wd, t)
		return nil, fmt.Errorf("daemonproc: the output: %w", err)
	}
	t.f = f
	t.pos.Store(offset)
	return t, nil
}

func (t *tail) wake() {
	select {
	case t.grew <- struct{}{}:
	default:
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
			t.pos.Add(int64(n))
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
		case <-t.w.closed:
			return 0, os.ErrClosed
		}
	}
}

// Close ends a Read in progress and releases the file and the watch.
// Idempotent.
func (t *tail) Close() {
	t.once.Do(func() {
		close(t.closed)
		t.w.remove(t.wd, t)
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
