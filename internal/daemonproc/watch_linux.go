package daemonproc

import (
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// watchMask: the file grew, or its writer closed it.
const watchMask = unix.IN_MODIFY | unix.IN_CLOSE_WRITE

// inotifyInit makes the watcher's inotify instance.
func inotifyInit() (*os.File, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("daemonproc: inotify: %w", err)
	}
	return os.NewFile(uintptr(fd), "inotify"), nil
}

func inotifyAdd(ino *os.File, path string) (int32, error) {
	rc, err := ino.SyscallConn()
	if err != nil {
		return 0, err
	}
	var wd int
	var werr error
	if err := rc.Control(func(fd uintptr) { wd, werr = unix.InotifyAddWatch(int(fd), path, watchMask) }); err != nil {
		return 0, err
	}
	return int32(wd), werr
}

func inotifyRemove(ino *os.File, wd int32) {
	if rc, err := ino.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _, _ = unix.InotifyRmWatch(int(fd), uint32(wd)) })
	}
}

// runInotify turns events into wake-ups of the tails they concern; it
// ends when close closes the instance.
func (w *watcher) runInotify() {
	defer w.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := w.ino.Read(buf)
		if err != nil {
			return
		}
		w.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			off += unix.SizeofInotifyEvent + nameLen
			switch {
			case mask&unix.IN_Q_OVERFLOW != 0:
				// Events were lost: every tail looks again.
				w.wakeAll()
			case mask&unix.IN_IGNORED != 0:
				for _, t := range w.byWD[wd] {
					t.wake()
				}
				delete(w.byWD, wd)
			default:
				for _, t := range w.byWD[wd] {
					t.wake()
				}
			}
		}
		w.mu.Unlock()
	}
}
