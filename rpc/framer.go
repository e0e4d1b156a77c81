package rpc

import (
	"bytes"
	"fmt"
	"io"
)

const (
	// DefaultMaxLineBytes is the default cap on one line read from an agent.
	// omp's protocol v2 reassembles frames up to 64 MiB; pi writes single lines
	// of any length.
	DefaultMaxLineBytes = 64 << 20

	// framerInitialBuf: large reads keep syscalls few under a flood.
	framerInitialBuf = 256 << 10
	// stableBuf is a stable framer's buffer: a default pipe delivers at
	// most 64 KiB per read, and a kept line keeps its whole buffer alive,
	// so no more while the agent is not flooding.
	stableBuf = 64 << 10
	// floodBuf is a stable framer's buffer while the agent writes faster
	// than the client reads (see framer.flooding): one read then takes up
	// to this much (with the pipe raised to match, see Client.resizePipe).
	// Not more: each read's bytes are copied in by the kernel, split by
	// the reader, then validated by the dispatcher, and 128 KiB of them
	// likely stay in cache from one pass to the next: agenthost prompt
	// read the bench's flood in 7-13 % less time than with 512 KiB
	// buffers, 2 % less than with 256 KiB, and 4 % less than with no
	// flood buffer (64 KiB reads from a default pipe).
	floodBuf = 128 << 10
	// floodLines: a flood buffer follows only a buffer that ended at least
	// this many lines. A kept line keeps its whole buffer alive, and a
	// buffer of a few long lines is mostly the dead head of the next one:
	// lines of 256 KiB in flood buffers of 512 KiB (their earlier size)
	// held twice their bytes, where small buffers hand a long line out as
	// one exact allocation.
	floodLines = 8
	// floodMark: a read of at least this much (half a default pipe) means
	// the agent is ahead of the reader; a shorter one, with room for more,
	// means the reader has caught up.
	floodMark = stableBuf / 2
	// framerShrinkAbove: a buffer grown past this for one long line is
	// released once that line is consumed, so one big frame does not pin
	// memory for the rest of the session.
	framerShrinkAbove = 1 << 20
	// segmentMax bounds one buffer of a stable framer reading a long line:
	// a line is kept as it arrived, in buffers of growing size up to this,
	// and joined once at its LF. Growing one buffer by doubling instead
	// allocates about twice the line (three times the cap for a line over it).
	segmentMax = 4 << 20
)

// LineTooLongError reports a line longer than the framer's cap. The line was
// skipped without being held in memory; reading goes on after it.
type LineTooLongError struct {
	Len int64 // bytes in the skipped line, without the LF
	Max int   // the cap in force
}

func (e *LineTooLongError) Error() string {
	return fmt.Sprintf("rpc: line of %d bytes exceeds the %d byte cap; skipped", e.Len, e.Max)
}

// Is lets callers match with errors.Is(err, ErrLineTooLong).
func (e *LineTooLongError) Is(target error) bool { return target == ErrLineTooLong }

// framer splits a byte stream into LF-terminated lines. It never splits on
// anything but LF (U+2028/U+2029 are data), drops a trailing CR, skips empty
// lines, and holds at most max bytes of one line in memory.
//
// The returned line aliases the framer's buffer: valid until the next call,
// or for good when the framer is stable. A stable framer reads a line longer
// than its buffer into further buffers (segs) and returns it joined into one
// exact allocation, so a line over the cap costs at most the cap. framer is
// not safe for concurrent use.
type framer struct {
	r          io.Reader
	buf        []byte
	start, end int // unread data is buf[start:end]
	scanned    int // buf[start:start+scanned] is known to hold no LF
	max        int
	err        error    // sticky read error, returned once the buffer is drained
	stable     bool     // lines stay valid after later calls (see fillStable)
	segs       [][]byte // stable only: the earlier parts of the pending line
	segLen     int      // bytes in segs
	total      int64    // bytes read from r so far
	// flooding (stable only): the last read that had room for floodMark
	// bytes got them (and settle has not been called since); new buffers
	// are floodBuf long meanwhile. onFlood, if set, is told each change.
	flooding bool
	onFlood  func(flooding bool)
	// lines ended in the current buffer (stable only).
	lines int
}

// offset is the stream position just past the last line next returned
// (past its LF): what was read minus what is still unread.
func (f *framer) offset() int64 { return f.total - int64(f.end-f.start) }

func newFramer(r io.Reader, max int, stable bool) *framer {
	if max <= 0 {
		max = DefaultMaxLineBytes
	}
	n := framerInitialBuf
	if stable {
		n = stableBuf
	}
	if n > max+1 {
		n = max + 1
	}
	return &framer{r: r, buf: make([]byte, n), max: max, stable: stable}
}

// next returns the next non-empty line. A line over the cap is consumed and
// reported as a *LineTooLongError; the caller may call next again. At the end
// of input it returns the reader's error (io.EOF for a clean end); a final
// line without LF is still returned first.
func (f *framer) next() ([]byte, error) {
	for {
		if i := bytes.IndexByte(f.buf[f.start+f.scanned:f.end], '\n'); i >= 0 {
			lineEnd := f.start + f.scanned + i
			line := f.buf[f.start:lineEnd]
			f.start = lineEnd + 1
			f.scanned = 0
			f.lines++
			if n := f.segLen + len(line); n > f.max {
				// Only a buffer larger than the cap holds a whole line over
				// it; the cap still applies.
				f.dropSegs()
				return nil, &LineTooLongError{Len: int64(n), Max: f.max}
			}
			if f.segLen > 0 {
				line = f.join(line)
			}
			if n := len(line); n > 0 && line[n-1] == '\r' {
				line = line[:n-1]
			}
			if len(line) == 0 {
				continue
			}
			return line, nil
		}
		f.scanned = f.end - f.start
		if f.err != nil {
			if f.pending() > f.max {
				return nil, f.skipLong()
			}
			if f.pending() > 0 {
				line := f.buf[f.start:f.end]
				if f.segLen > 0 {
					line = f.join(line)
				}
				f.start, f.end, f.scanned = 0, 0, 0
				if n := len(line); n > 0 && line[n-1] == '\r' {
					line = line[:n-1]
				}
				if len(line) > 0 {
					return line, nil
				}
			}
			return nil, f.err
		}
		if f.pending() > f.max {
			return nil, f.skipLong()
		}
		f.fill()
	}
}

// pending is the length of the unfinished line read so far.
func (f *framer) pending() int { return f.segLen + f.end - f.start }

// join returns the pending line (segs, then tail) in one new slice of its
// exact length, and drops the segments.
func (f *framer) join(tail []byte) []byte {
	line := make([]byte, 0, f.segLen+len(tail))
	for _, s := range f.segs {
		line = append(line, s...)
	}
	line = append(line, tail...)
	f.dropSegs()
	return line
}

func (f *framer) dropSegs() {
	clear(f.segs)
	f.segs = f.segs[:0]
	f.segLen = 0
}

// fill reads more data, making room first: compact, shrink after a long
// line, or grow up to max+1 bytes.
func (f *framer) fill() {
	if f.stable {
		f.fillStable()
		return
	}
	if f.start > 0 && (f.end == len(f.buf) || f.start == f.end) {
		if f.start == f.end && len(f.buf) > framerShrinkAbove {
			f.buf = make([]byte, framerInitialBuf)
		} else {
			copy(f.buf, f.buf[f.start:f.end])
		}
		f.end -= f.start
		f.start = 0
	}
	if f.end == len(f.buf) {
		n := len(f.buf) * 2
		if n > f.max+1 {
			n = f.max + 1
		}
		nb := make([]byte, n)
		copy(nb, f.buf[:f.end])
		f.buf = nb
	}
	f.read()
}

// fillStable never writes over bytes already handed out: when the buffer
// is full it reads on into a new one, so every line returned stays valid for
// as long as its holder keeps it. A short unfinished line moves along into
// the new buffer; a long one stays where it is, as a segment, and the new
// buffer grows with the line (up to segmentMax, and never past the cap in
// total), so no byte of a long line is copied before its LF.
//
// The buffer is floodBuf long while the agent floods, stableBuf otherwise;
// once a flood is over and every line in a flood buffer has been handed
// out, the framer moves to a fresh small buffer, so an idle client keeps
// no more than one small buffer alive.
func (f *framer) fillStable() {
	size := min(stableBuf, f.max+1)
	if f.flooding && f.lines >= floodLines {
		size = min(floodBuf, f.max+1)
	}
	if f.end == len(f.buf) {
		f.lines = 0
		if pending := f.end - f.start; f.segLen == 0 && pending*2 <= size {
			nb := make([]byte, size)
			f.end = copy(nb, f.buf[f.start:f.end])
			f.start = 0
			f.buf = nb
		} else {
			if pending > 0 {
				f.segs = append(f.segs, f.buf[f.start:f.end:f.end])
				f.segLen += pending
			}
			// pending() <= max here, so the size is at least 1.
			size := min(max(f.segLen, size), segmentMax, f.max+1-f.segLen)
			f.buf = make([]byte, size)
			f.start, f.end, f.scanned = 0, 0, 0
		}
	} else if !f.flooding && f.start == f.end && f.segLen == 0 && len(f.buf) > size {
		f.lines = 0
		f.buf = make([]byte, size)
		f.start, f.end, f.scanned = 0, 0, 0
	}
	room := len(f.buf) - f.end
	n := f.read()
	if room >= floodMark && f.err == nil {
		f.setFlooding(n >= floodMark)
	}
}

func (f *framer) setFlooding(flooding bool) {
	if flooding != f.flooding {
		f.flooding = flooding
		if f.onFlood != nil {
			f.onFlood(flooding)
		}
	}
}

// settle ends a flood: the stream has reached a point after which the
// agent writes little (its run ended). Without it, a flood whose last read
// was a large one would keep its buffer and pipe size until the agent next
// writes, however long it stays quiet.
func (f *framer) settle() { f.setFlooding(false) }

func (f *framer) read() int {
	n, err := f.r.Read(f.buf[f.end:])
	f.end += n
	f.total += int64(n)
	if err != nil {
		f.err = err
	}
	return n
}

// skipLong discards the rest of a line that is over the cap, reading until
// its LF (or the end of input) without keeping it.
func (f *framer) skipLong() error {
	skipped := int64(f.pending())
	f.dropSegs()
	f.start, f.end, f.scanned = 0, 0, 0
	if f.stable {
		f.lines = 0
		f.buf = make([]byte, stableBuf) // the old one may hold lines handed out
	} else if len(f.buf) > framerShrinkAbove {
		f.buf = make([]byte, framerInitialBuf)
	}
	for {
		if f.err != nil {
			return &LineTooLongError{Len: skipped, Max: f.max}
		}
		n, err := f.r.Read(f.buf)
		f.total += int64(n)
		if err != nil {
			f.err = err
		}
		if i := bytes.IndexByte(f.buf[:n], '\n'); i >= 0 {
			skipped += int64(i)
			f.start, f.end = i+1, n
			return &LineTooLongError{Len: skipped, Max: f.max}
		}
		skipped += int64(n)
	}
}
