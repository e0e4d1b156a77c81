//go:build !linux

package daemonproc

import (
	"errors"
	"os"
)

// errNoInotify: there is no inotify here; the watcher polls.
var errNoInotify = errors.New("daemonproc: no inotify on this system")

func inotifyInit() (*os.File, error)             { return nil, errNoInotify }
func inotifyAdd(*os.File, string) (int32, error) { return 0, errNoInotify }
func inotifyRemove(*os.File, int32)              {}
func (w *watcher) runInotify()                   { w.wg.Done() }
