package acp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
)

const (
	// DefaultMaxLineBytes caps one line from the agent. It is also the most
	// allowed: lines the SDK reads must fit its own 10 MiB scanner, or it
	// drops the connection.
	DefaultMaxLineBytes = 8 << 20
	maxLineLimit        = 10<<20 - 1
	// DefaultStderrTail is how much of the agent's stderr is kept (its
	// tail), for error messages.
	DefaultStderrTail = 16 << 10
)

// ErrMalformed matches (errors.Is) a LineError: a line from the agent
// that was not a JSON-RPC message, or was too long. Such a line is reported
// and dropped; reading goes on.
var ErrMalformed = errors.New("acp: malformed line from the agent")

// LineError says what was wrong with a line from the agent. It never
// carries the line itself.
type LineError struct {
	Line   int64  // 1-based line number on the agent's stdout
	Len    int64  // bytes in the line, without the LF
	Reason string // "too long", "not JSON", "not a JSON-RPC message", ...
}

func (e *LineError) Error() string {
	return fmt.Sprintf("acp: line %d from the agent (%d bytes) dropped: %s", e.Line, e.Len, e.Reason)
}

// Is makes errors.Is(err, ErrMalformed) true.
func (e *LineError) Is(target error) bool { return target == ErrMalformed }

// lineReader reads LF-terminated lines, holding at most max bytes of one;
// a longer line is skipped (consumed, not kept) and reported by its length.
type lineReader struct {
	r   *bufio.Reader
	max int
	buf []byte
	n   int64 // lines read
}

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// next returns the next line without its LF (aliasing an internal buffer
// until the next call), or a *LineError for a line over the cap, or the
// read error (io.EOF at the end; a final line without LF is returned
// first).
func (l *lineReader) next() ([]byte, error) {
	l.buf = l.buf[:0]
	var total int64
	for {
		chunk, err := l.r.ReadSlice('\n')
		total += int64(len(chunk))
		if total <= int64(l.max)+1 {
			l.buf = append(l.buf, chunk...)
		}
		switch {
		case err == nil:
			l.n++
			line := bytes.TrimSuffix(l.buf, []byte("\n"))
			if total-1 > int64(l.max) {
				return nil, &LineError{Line: l.n, Len: total - 1, Reason: fmt.Sprintf("longer than the %d byte cap", l.max)}
			}
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			if total == 0 {
				return nil, err
			}
			l.n++
			if total > int64(l.max) {
				return nil, &LineError{Line: l.n, Len: total, Reason: fmt.Sprintf("longer than the %d byte cap", l.max)}
			}
			return l.buf, nil
		}
	}
}

// tail keeps the last n bytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
	n   int
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(p) >= t.n {
		t.buf = append(t.buf[:0], p[len(p)-t.n:]...)
		return len(p), nil
	}
	if over := len(t.buf) + len(p) - t.n; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
