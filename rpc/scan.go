package rpc

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/bits"
)

// maxJSONDepth bounds nesting so a hostile frame cannot exhaust the stack.
const maxJSONDepth = 10000

// SyntaxError reports a frame that is not a single valid JSON object.
type SyntaxError struct {
	Offset int    // byte offset of the problem
	Msg    string // what was wrong
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("rpc: invalid JSON frame at byte %d: %s", e.Offset, e.Msg)
}

// frameHead is what the reader needs from every frame without decoding it:
// the top-level "type" and "id" strings.
type frameHead struct {
	typ []byte // raw string contents (unescaped only when hasEsc is false)
	id  []byte
	// typEsc/idEsc: the value had escapes and must be decoded before use.
	typEsc, idEsc bool
	hasID         bool
	// idNum: the id is a JSON number (id holds its literal text), as a
	// hand-written RequestLine may send and the agent echoes back.
	idNum bool
	// id2 is a second id (when "id" is duplicated), so an error can reach
	// each waiter the frame names.
	id2            []byte
	id2Esc, hasID2 bool
}

// DuplicateKeyError reports a frame with a top-level "type" or "id" key
// given twice, in any spelling encoding/json takes for it ("ID", "Id",
// "\u0069d"). Such a frame is refused: readers disagree on which one
// counts (the fast path reads the first, encoding/json keeps the last).
type DuplicateKeyError struct {
	Key string
}

func (e *DuplicateKeyError) Error() string {
	return fmt.Sprintf("rpc: frame has the top-level key %q twice", e.Key)
}

// scanFrame validates that b is exactly one JSON object and extracts its
// top-level "type" and "id" strings. It allocates nothing on valid input.
// It validates structure and string escapes as encoding/json does (invalid
// UTF-8 inside strings is accepted, as encoding/json accepts it).
func scanFrame(b []byte) (frameHead, error) {
	var h frameHead
	var seenType, seenID bool
	var dup string
	s := scanner{b: b}
	s.ws()
	if s.i >= len(b) || b[s.i] != '{' {
		if s.i >= len(b) {
			return h, s.fail("empty frame")
		}
		return h, s.fail("frame is not a JSON object")
	}
	s.i++
	s.ws()
	if s.i < len(b) && b[s.i] == '}' {
		s.i++
	} else {
		for {
			s.ws()
			ks, ke, kesc, err := s.str()
			if err != nil {
				return h, err
			}
			s.ws()
			if s.i >= len(b) || b[s.i] != ':' {
				return h, s.fail("expected ':' after object key")
			}
			s.i++
			s.ws()
			key := b[ks:ke]
			isType := keyIs(key, kesc, "type")
			isID := !isType && keyIs(key, kesc, "id")
			if isType {
				if seenType {
					dup = "type"
				}
				seenType = true
			} else if isID {
				if seenID {
					dup = "id"
				}
				seenID = true
			}
			if (isType || isID) && s.i < len(b) && b[s.i] == '"' {
				vs, ve, esc, err := s.str()
				if err != nil {
					return h, err
				}
				if isType {
					if h.typ == nil {
						h.typ, h.typEsc = b[vs:ve], esc
					}
				} else {
					h.noteID(b[vs:ve], esc, false)
				}
			} else if isID && s.i < len(b) && (b[s.i] == '-' || b[s.i] >= '0' && b[s.i] <= '9') {
				vs := s.i
				if err := s.num(); err != nil {
					return h, err
				}
				h.noteID(b[vs:s.i], false, true)
			} else if err := s.value(1); err != nil {
				return h, err
			}
			s.ws()
			if s.i >= len(b) {
				return h, s.fail("unexpected end of object")
			}
			if b[s.i] == ',' {
				s.i++
				continue
			}
			if b[s.i] == '}' {
				s.i++
				break
			}
			return h, s.fail("expected ',' or '}' in object")
		}
	}
	s.ws()
	if s.i != len(b) {
		return h, s.fail("data after the JSON object")
	}
	if dup != "" {
		return h, &DuplicateKeyError{Key: dup}
	}
	return h, nil
}

// keyIs reports whether the object key raw (its contents, escaped when
// esc) names the field name as encoding/json matches keys: unescaped, and
// exact or else case-folded (bytes.EqualFold), so "ID", "Id" and
// "\u0069d" are all "id" to the decoder and must be to the scanner too.
func keyIs(raw []byte, esc bool, name string) bool {
	if !esc {
		// A folded match is at most three bytes a rune.
		return len(raw) >= len(name) && len(raw) <= 3*len(name) && bytes.EqualFold(raw, []byte(name))
	}
	return bytes.EqualFold([]byte(headString(raw, true)), []byte(name))
}

func (h *frameHead) noteID(raw []byte, esc, num bool) {
	if !h.hasID {
		h.id, h.idEsc, h.hasID, h.idNum = raw, esc, true, num
	} else if !h.hasID2 {
		h.id2, h.id2Esc, h.hasID2 = raw, esc, true
	}
}

// idStrings returns the ids the frame names (for routing an error).
func (h *frameHead) idStrings() []string {
	var out []string
	if h.hasID {
		out = append(out, headString(h.id, h.idEsc))
	}
	if h.hasID2 {
		out = append(out, headString(h.id2, h.id2Esc))
	}
	return out
}

// headString returns the frame's string value, decoding escapes if needed.
func headString(raw []byte, esc bool) string {
	if !esc {
		return string(raw)
	}
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	var out string
	if json.Unmarshal(q, &out) != nil {
		return string(raw)
	}
	return out
}

type scanner struct {
	b []byte
	i int
}

func (s *scanner) fail(msg string) error { return &SyntaxError{Offset: s.i, Msg: msg} }

func (s *scanner) ws() {
	for s.i < len(s.b) {
		c := s.b[s.i]
		if c > ' ' || (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
			return
		}
		s.i++
	}
}

func (s *scanner) value(depth int) error {
	if depth > maxJSONDepth {
		return s.fail("nesting too deep")
	}
	if s.i >= len(s.b) {
		return s.fail("unexpected end of input")
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, _, _, err := s.str()
		return err
	case c == '{':
		s.i++
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == '}' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if _, _, _, err := s.str(); err != nil {
				return err
			}
			s.ws()
			if s.i >= len(s.b) || s.b[s.i] != ':' {
				return s.fail("expected ':' after object key")
			}
			s.i++
			s.ws()
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.ws()
			if s.i >= len(s.b) {
				return s.fail("unexpected end of object")
			}
			if s.b[s.i] == ',' {
				s.i++
				continue
			}
			if s.b[s.i] == '}' {
				s.i++
				return nil
			}
			return s.fail("expected ',' or '}' in object")
		}
	case c == '[':
		s.i++
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.ws()
			if s.i >= len(s.b) {
				return s.fail("unexpected end of array")
			}
			if s.b[s.i] == ',' {
				s.i++
				continue
			}
			if s.b[s.i] == ']' {
				s.i++
				return nil
			}
			return s.fail("expected ',' or ']' in array")
		}
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return s.num()
	default:
		return s.fail("unexpected character")
	}
}

func (s *scanner) lit(w string) error {
	if len(s.b)-s.i < len(w) || string(s.b[s.i:s.i+len(w)]) != w {
		return s.fail("invalid literal")
	}
	s.i += len(w)
	return nil
}

func (s *scanner) num() error {
	b := s.b
	i := s.i
	if b[i] == '-' {
		i++
	}
	if i >= len(b) {
		s.i = i
		return s.fail("invalid number")
	}
	if b[i] == '0' {
		i++
	} else if b[i] >= '1' && b[i] <= '9' {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	} else {
		s.i = i
		return s.fail("invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		st := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == st {
			s.i = i
			return s.fail("invalid number")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		st := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == st {
			s.i = i
			return s.fail("invalid number")
		}
	}
	s.i = i
	return nil
}

const (
	lo8 = 0x0101010101010101
	hi8 = 0x8080808080808080
)

// str scans a string starting at s.i (which must be '"') and returns the
// bounds of its contents. Eight bytes at a time where no quote, backslash or
// control byte is present.
func (s *scanner) str() (start, end int, esc bool, err error) {
	b := s.b
	if s.i >= len(b) || b[s.i] != '"' {
		return 0, 0, false, s.fail("expected string")
	}
	i := s.i + 1
	start = i
	for {
		for i+8 <= len(b) {
			if i-start >= 64 {
				// A long string (message text carries most bytes): go on
				// with vectorised searches.
				s.i = i
				end, e, err := s.strLong(start)
				return start, end, esc || e, err
			}
			if t := special(binary.LittleEndian.Uint64(b[i:])); t != 0 {
				// The lowest flagged byte is exact (borrows only carry
				// upwards): jump straight to it.
				i += bits.TrailingZeros64(t) >> 3
				break
			}
			i += 8
		}
		if i >= len(b) {
			s.i = i
			return 0, 0, false, s.fail("unterminated string")
		}
		switch c := b[i]; {
		case c == '"':
			s.i = i + 1
			return start, i, esc, nil
		case c == '\\':
			esc = true
			n, err := s.escape(i)
			if err != nil {
				return 0, 0, false, err
			}
			i += n
		case c < 0x20:
			s.i = i
			return 0, 0, false, s.fail("control character in string")
		default:
			i++
		}
	}
}

// strLong finishes a string from s.i in time linear in its length: the next
// quote and the next backslash are found with IndexByte, the clean runs
// between them checked for control bytes, and a quote position is searched
// again only once an escape has passed it.
func (s *scanner) strLong(start int) (end int, esc bool, err error) {
	b := s.b
	i := s.i
	q := -1 // absolute position of the next unescaped-looking quote
	for {
		if q < i {
			rel := bytes.IndexByte(b[i:], '"')
			if rel < 0 {
				s.i = len(b)
				return 0, false, s.fail("unterminated string")
			}
			q = i + rel
		}
		clean := q
		if bs := bytes.IndexByte(b[i:q], '\\'); bs >= 0 {
			clean = i + bs
		}
		if hasControl(b[i:clean]) {
			for i < clean && b[i] >= 0x20 {
				i++
			}
			s.i = i
			return 0, false, s.fail("control character in string")
		}
		if clean == q {
			s.i = q + 1
			return q, esc, nil
		}
		esc = true
		n, err := s.escape(clean)
		if err != nil {
			return 0, false, err
		}
		i = clean + n
	}
}

// escape validates the escape sequence at b[i] (a backslash) and returns
// its length.
func (s *scanner) escape(i int) (int, error) {
	b := s.b
	if i+1 >= len(b) {
		s.i = i
		return 0, s.fail("unterminated string")
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		if i+6 > len(b) || !isHex4(b[i+2:i+6]) {
			s.i = i
			return 0, s.fail("invalid \\u escape")
		}
		return 6, nil
	}
	s.i = i
	return 0, s.fail("invalid escape")
}

// special flags (high bit set) the bytes of x that are a quote, a
// backslash or a control byte; 0 when there is none.
func special(x uint64) uint64 {
	q := x ^ (lo8 * '"')
	bs := x ^ (lo8 * '\\')
	return (((x - lo8*0x20) & ^x) | ((q - lo8) & ^q) | ((bs - lo8) & ^bs)) & hi8
}

// hasControl: some byte of b is below 0x20 (forbidden raw in a string).
func hasControl(b []byte) bool {
	i := 0
	for ; i+16 <= len(b); i += 16 {
		x := binary.LittleEndian.Uint64(b[i:])
		y := binary.LittleEndian.Uint64(b[i+8:])
		if (((x-lo8*0x20)&^x)|((y-lo8*0x20)&^y))&hi8 != 0 {
			return true
		}
	}
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			return true
		}
	}
	return false
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}
