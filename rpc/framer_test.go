package rpc

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
)

func readAll(t testing.TB, r io.Reader, max int) (lines []string, tooLong []int64) {
	return readAllMode(t, r, max, false)
}

// readAllMode reads every line; in stable mode it also checks, at the end,
// that no line handed out earlier was overwritten.
func readAllMode(t testing.TB, r io.Reader, max int, stable bool) (lines []string, tooLong []int64) {
	f := newFramer(r, max, stable)
	var kept [][]byte
	defer func() {
		for i, k := range kept {
			if string(k) != lines[i] {
				t.Fatalf("stable framer: line %d changed after later reads: %q, was %q", i, k, lines[i])
			}
		}
	}()
	for {
		line, err := f.next()
		var tl *LineTooLongError
		switch {
		case errors.As(err, &tl):
			tooLong = append(tooLong, tl.Len)
		case errors.Is(err, io.EOF):
			return lines, tooLong
		case err != nil:
			t.Fatalf("next: %v", err)
		default:
			lines = append(lines, string(line))
			if stable {
				kept = append(kept, line)
			}
		}
	}
}

func TestFramer_Splitting(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"lf", "a\nb\n", []string{"a", "b"}},
		{"crlf", "a\r\nb\r\n", []string{"a", "b"}},
		{"no final lf", "a\nb", []string{"a", "b"}},
		{"empty lines skipped", "\n\na\n\r\n\nb\n", []string{"a", "b"}},
		{"u2028 is data", "{\"t\":\"x\u2028y\u2029z\"}\n", []string{"{\"t\":\"x\u2028y\u2029z\"}"}},
		{"lone cr is data", "a\rb\n", []string{"a\rb"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(tt.in), iotest.OneByteReader(strings.NewReader(tt.in))} {
				got, tl := readAll(t, r, 1<<20)
				if len(tl) != 0 || strings.Join(got, "|") != strings.Join(tt.want, "|") {
					t.Fatalf("got %q (too long %v), want %q", got, tl, tt.want)
				}
			}
		})
	}
}

func TestFramer_LongLines(t *testing.T) {
	big := strings.Repeat("x", 3<<20)
	in := "a\n" + big + "\nb\n" + strings.Repeat("y", 100) + "\n"
	// Within the cap: the 3 MiB line comes through whole.
	got, tl := readAll(t, strings.NewReader(in), 4<<20)
	if len(tl) != 0 || len(got) != 4 || got[1] != big {
		t.Fatalf("4 MiB cap: got %d lines, too long %v", len(got), tl)
	}
	// Over the cap: reported with its length, skipped, reading goes on.
	for _, stable := range []bool{false, true} {
		got, tl = readAllMode(t, iotest.HalfReader(strings.NewReader(in)), 1<<20, stable)
		if len(tl) != 1 || strings.Join(got, "|") != "a|b|"+strings.Repeat("y", 100) {
			t.Fatalf("stable=%v: lines %d, too long %v", stable, len(got), tl)
		}
	}
	got, tl = readAll(t, iotest.HalfReader(strings.NewReader(in)), 1<<20)
	if len(tl) != 1 || tl[0] != int64(len(big)) {
		t.Fatalf("too long = %v, want [%d]", tl, len(big))
	}
	if strings.Join(got, "|") != "a|b|"+strings.Repeat("y", 100) {
		t.Fatalf("lines after the long one: %q", got)
	}
	// A long final line without LF is reported too.
	_, tl = readAll(t, strings.NewReader("a\n"+big), 1<<20)
	if len(tl) != 1 || tl[0] != int64(len(big)) {
		t.Fatalf("unterminated long line: too long = %v", tl)
	}
}

// TestFramer_ExactCap: a line of exactly max bytes passes, max+1 does not.
func TestFramer_ExactCap(t *testing.T) {
	const max = 1000
	ok := strings.Repeat("a", max)
	over := strings.Repeat("b", max+1)
	got, tl := readAll(t, strings.NewReader(ok+"\n"+over+"\nc\n"), max)
	if len(got) != 2 || got[0] != ok || got[1] != "c" || len(tl) != 1 || tl[0] != max+1 {
		t.Fatalf("got %d lines, too long %v", len(got), tl)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestFramer_ReadError(t *testing.T) {
	boom := errors.New("boom")
	f := newFramer(io.MultiReader(strings.NewReader("a\nb"), errReader{boom}), 0, false)
	var lines []string
	for {
		l, err := f.next()
		if err != nil {
			if !errors.Is(err, boom) {
				t.Fatalf("err = %v, want boom", err)
			}
			break
		}
		lines = append(lines, string(l))
	}
	if strings.Join(lines, "|") != "a|b" {
		t.Fatalf("lines = %q", lines)
	}
}

// FuzzFramer checks the framer against a plain reference split, for any
// input and any read sizes.
func FuzzFramer(f *testing.F) {
	f.Add([]byte("{\"type\":\"agent_start\"}\n{\"type\":\"x\"}\r\n"), 3, 64)
	f.Add([]byte("\n\n\r\n"), 1, 8)
	f.Add([]byte("abc\u2028def\nghi"), 2, 4)
	f.Add(bytes.Repeat([]byte("x"), 300), 7, 100)
	f.Fuzz(func(t *testing.T, in []byte, chunk, max int) {
		if chunk <= 0 || chunk > 1<<16 {
			chunk = 1 + (chunk&0xff)%64
		}
		if max <= 0 || max > 1<<16 {
			max = 1 + (max&0xffff)%512
		}
		var want []string
		var wantLong []int64
		for i, part := range bytes.Split(in, []byte("\n")) {
			last := i == bytes.Count(in, []byte("\n"))
			_ = last
			raw := len(part)
			if len(part) > 0 && part[len(part)-1] == '\r' {
				part = part[:len(part)-1]
			}
			if raw > max {
				wantLong = append(wantLong, int64(raw))
				continue
			}
			if len(part) > 0 {
				want = append(want, string(part))
			}
		}
		got, gotLong := readAll(t, iotest.DataErrReader(&chunkReader{b: in, n: chunk}), max)
		sgot, sLong := readAllMode(t, iotest.DataErrReader(&chunkReader{b: in, n: chunk}), max, true)
		if strings.Join(sgot, "\n") != strings.Join(got, "\n") || len(sgot) != len(got) || len(sLong) != len(gotLong) {
			t.Fatalf("stable framer differs: %q vs %q", sgot, got)
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") || len(got) != len(want) {
			t.Fatalf("lines: got %q want %q", got, want)
		}
		if len(gotLong) != len(wantLong) {
			t.Fatalf("too long: got %v want %v", gotLong, wantLong)
		}
		for i := range gotLong {
			if gotLong[i] != wantLong[i] {
				t.Fatalf("too long: got %v want %v", gotLong, wantLong)
			}
		}
	})
}

type chunkReader struct {
	b []byte
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := min(r.n, len(p), len(r.b))
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// hugeLineReader yields a line of n bytes of 'x', its LF, then tail, without
// holding the line in memory.
type hugeLineReader struct {
	n    int64
	tail string
}

func (r *hugeLineReader) Read(p []byte) (int, error) {
	if r.n > 0 {
		k := int(min(int64(len(p)), r.n))
		for i := range p[:k] {
			p[i] = 'x'
		}
		r.n -= int64(k)
		return k, nil
	}
	if r.n == 0 {
		r.n = -1
		p[0] = '\n'
		return 1, nil
	}
	if r.tail == "" {
		return 0, io.EOF
	}
	k := copy(p, r.tail)
	r.tail = r.tail[k:]
	return k, nil
}

// TestFramer_OverCapLineCostsAtMostTheCap: a line far over the cap costs
// the cap plus a small constant in allocations, not the doubling of a
// growing buffer (which allocated about twice the cap).
func TestFramer_OverCapLineCostsAtMostTheCap(t *testing.T) {
	const max = 16 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	lines, tl := readAllMode(t, &hugeLineReader{n: 50 << 20, tail: "after\n"}, max, true)
	runtime.ReadMemStats(&after)
	if len(tl) != 1 || tl[0] != 50<<20 || len(lines) != 1 || lines[0] != "after" {
		t.Fatalf("too long %v, lines %q", tl, lines)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d KiB for a %d MiB line with a %d MiB cap", alloc>>10, 50, max>>20)
	if alloc > max+1<<20 {
		t.Fatalf("allocated %d bytes for an over-cap line; want at most the cap (%d) plus 1 MiB", alloc, max)
	}
}

// TestFramer_LongLineAcrossBuffers: lines longer than a stable buffer come
// through whole, each its own exact slice, and later reads never change them.
func TestFramer_LongLineAcrossBuffers(t *testing.T) {
	var in strings.Builder
	var want []string
	for i, n := range []int{10, 40 << 10, 200 << 10, 5, 3 << 20, 64 << 10, 1} {
		l := strings.Repeat(string(rune('a'+i)), n)
		want = append(want, l)
		in.WriteString(l + "\r\n")
	}
	for _, r := range []io.Reader{strings.NewReader(in.String()), iotest.HalfReader(strings.NewReader(in.String()))} {
		got, tl := readAllMode(t, r, 4<<20, true)
		if len(tl) != 0 || strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("got %d lines (too long %v)", len(got), tl)
		}
	}
}

// TestFramer_StableRandomLongLines compares the stable framer with a plain
// split on lines around the buffer sizes, read in random pieces, with caps
// that some lines exceed.
//
// The input is built in place in one allocation and the expected lines are
// slices of it, compared one by one: under -race every copy of these
// megabytes costs more than the framer's own work, and the copies (append
// growth, a string per line, two joins) were most of the test's time. The
// random lengths, pieces and caps are the same as before.
func TestFramer_StableRandomLongLines(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 20; round++ {
		max := []int{100 << 10, 1 << 20, 5 << 20}[round%3]
		var lens [12]int
		total := 0
		for i := range lens {
			lens[i] = rng.IntN(6 << 20 >> (rng.IntN(5) * 2))
			total += lens[i] + 1
		}
		in := make([]byte, 0, total)
		var want [][]byte
		var wantLong []int64
		for i, n := range lens {
			start := len(in)
			in = in[:start+n]
			l := in[start:]
			if n > 0 {
				l[0] = byte('a' + i)
				for k := 1; k < n; k *= 2 {
					copy(l[k:], l[:k])
				}
			}
			in = append(in, '\n')
			switch {
			case n > max:
				wantLong = append(wantLong, int64(n))
			case n > 0:
				want = append(want, l)
			}
		}
		got, gotLong := readAllMode(t, &chunkReader{b: in, n: 1 + rng.IntN(200<<10)}, max, true)
		same := len(got) == len(want) && len(gotLong) == len(wantLong)
		for i := 0; same && i < len(got); i++ {
			same = got[i] == string(want[i])
		}
		if !same {
			t.Fatalf("round %d: %d lines, too long %v; want %d lines, too long %v", round, len(got), gotLong, len(want), wantLong)
		}
		for i := range gotLong {
			if gotLong[i] != wantLong[i] {
				t.Fatalf("round %d: too long %v, want %v", round, gotLong, wantLong)
			}
		}
	}
}

// scriptedReader returns the stream in reads of the sizes given, in turn
// (the last size repeats).
type scriptedReader struct {
	b     []byte
	sizes []int
}

func (r *scriptedReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := min(r.sizes[0], len(p), len(r.b))
	if len(r.sizes) > 1 {
		r.sizes = r.sizes[1:]
	}
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// TestFramer_FloodBuffers: a stable framer reads a flood (reads that fill
// half a default pipe or more) into flood-sized buffers and says so once;
// when reads come back short it says that once, and as soon as its lines
// are all handed out it reads into a small buffer again, so an idle client
// holds no flood buffer. Every line stays what it was.
func TestFramer_FloodBuffers(t *testing.T) {
	line := strings.Repeat("x", 99) + "\n" // 100 bytes
	flood := strings.Repeat(line, 40_000)  // about 4 MB
	trickle := strings.Repeat(line, 50)
	sizes := []int{100} // the start: short reads
	for range len(flood) / (64 << 10) {
		sizes = append(sizes, 64<<10) // a full default pipe each time
	}
	sizes = append(sizes, 100) // then caught up
	r := &scriptedReader{b: []byte(line + flood + trickle), sizes: sizes}
	f := newFramer(r, DefaultMaxLineBytes, true)
	var changes []bool
	f.onFlood = func(flooding bool) { changes = append(changes, flooding) }
	var kept [][]byte
	sawFloodBuf := false
	for {
		l, err := f.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if string(l)+"\n" != line {
			t.Fatalf("line %d: %q", len(kept), l)
		}
		kept = append(kept, l)
		if len(f.buf) == floodBuf {
			sawFloodBuf = true
		}
		if !f.flooding && f.start == f.end && len(kept) > 1 && len(r.sizes) == 1 && f.segLen == 0 {
			// Caught up and drained: the next read must go to a small buffer.
			f.fill()
			if len(f.buf) != stableBuf {
				t.Fatalf("after the flood the framer reads into a %d byte buffer, want %d", len(f.buf), stableBuf)
			}
		}
	}
	if want := 1 + 40_000 + 50; len(kept) != want {
		t.Fatalf("%d lines, want %d", len(kept), want)
	}
	for i, k := range kept {
		if string(k)+"\n" != line {
			t.Fatalf("line %d changed after later reads: %q", i, k)
		}
	}
	if !sawFloodBuf {
		t.Fatalf("the flood was never read into a %d byte buffer", floodBuf)
	}
	if len(changes) != 2 || !changes[0] || changes[1] {
		t.Fatalf("flood changes %v, want [true false]", changes)
	}
}

// TestFramer_SettleEndsAFlood: a flood whose last read was a large one
// ends when the reader says the run is over (settle): the framer says so,
// and reads on into a small buffer, not the flood's.
func TestFramer_SettleEndsAFlood(t *testing.T) {
	line := strings.Repeat("y", 127) + "\n"
	in := strings.Repeat(line, 2_048) // 256 KiB: four full-pipe reads
	f := newFramer(&scriptedReader{b: []byte(in), sizes: []int{64 << 10}}, DefaultMaxLineBytes, true)
	var changes []bool
	f.onFlood = func(flooding bool) { changes = append(changes, flooding) }
	for range 2_048 {
		if l, err := f.next(); err != nil || string(l)+"\n" != line {
			t.Fatalf("line: %q, %v", l, err)
		}
	}
	if !f.flooding || len(f.buf) != floodBuf {
		t.Fatalf("flooding %v with a %d byte buffer after full-pipe reads", f.flooding, len(f.buf))
	}
	f.settle()
	if _, err := f.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last line: %v", err)
	}
	if len(f.buf) != stableBuf {
		t.Fatalf("after settle the framer reads into a %d byte buffer, want %d", len(f.buf), stableBuf)
	}
	if len(changes) != 2 || !changes[0] || changes[1] {
		t.Fatalf("flood changes %v, want [true false]", changes)
	}
}

// TestFramer_LongLinesInAFloodKeepTheirSize: a flood of long lines (pi
// repeats the whole partial message in each update) is not read into
// flood buffers: kept lines hold about their own bytes, not the twice as
// much that buffers of one line and the next one's head held.
func TestFramer_LongLinesInAFloodKeepTheirSize(t *testing.T) {
	const n, size = 40, 256<<10 + 100
	line := strings.Repeat("z", size-1) + "\n"
	in := []byte(strings.Repeat(line, n))
	f := newFramer(&scriptedReader{b: in, sizes: []int{64 << 10}}, DefaultMaxLineBytes, true)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	kept := make([][]byte, 0, n)
	for range n {
		l, err := f.next()
		if err != nil || len(l) != size-1 {
			t.Fatalf("line %d: %d bytes, %v", len(kept), len(l), err)
		}
		kept = append(kept, l)
	}
	f = nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d lines of %d KiB hold %d KiB", n, size>>10, held>>10)
	if held > n*size*5/4 {
		t.Fatalf("%d lines of %d KiB hold %d KiB; want at most a quarter more than their bytes", n, size>>10, held>>10)
	}
	runtime.KeepAlive(kept)
	runtime.KeepAlive(in)
}
