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
	// The position is passed along in i, not kept in a struct, so it stays
	// in a register.
	i := ws(b, 0)
	if i >= len(b) || b[i] != '{' {
		if i >= len(b) {
			return h, syntaxError(i, "empty frame")
		}
		return h, syntaxError(i, "frame is not a JSON object")
	}
	i = ws(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			i = ws(b, i)
			ks, ke, next, kesc, err := scanStr(b, i)
			if err != nil {
				return h, err
			}
			i = ws(b, next)
			if i >= len(b) || b[i] != ':' {
				return h, syntaxError(i, "expected ':' after object key")
			}
			i = ws(b, i+1)
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
			if (isType || isID) && i < len(b) && b[i] == '"' {
				vs, ve, next, esc, err := scanStr(b, i)
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
				i = next
			} else if isID && i < len(b) && (b[i] == '-' || b[i] >= '0' && b[i] <= '9') {
				next, err := scanNum(b, i)
				if err != nil {
					return h, err
				}
				h.noteID(b[i:next], false, true)
				i = next
			} else {
				next, err := scanValue(b, i, 1)
				if err != nil {
					return h, err
				}
				i = next
			}
			i = ws(b, i)
			if i >= len(b) {
				return h, syntaxError(i, "unexpected end of object")
			}
			if b[i] == ',' {
				i++
				continue
			}
			if b[i] == '}' {
				i++
				break
			}
			return h, syntaxError(i, "expected ',' or '}' in object")
		}
	}
	i = ws(b, i)
	if i != len(b) {
		return h, syntaxError(i, "data after the JSON object")
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

func syntaxError(i int, msg string) error { return &SyntaxError{Offset: i, Msg: msg} }

// ws returns the position of the first byte at or after i that is not
// JSON whitespace.
func ws(b []byte, i int) int {
	for i < len(b) {
		c := b[i]
		if c > ' ' || (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
			return i
		}
		i++
	}
	return i
}

// scanValue validates the value at b[i] and returns the position after it.
func scanValue(b []byte, i, depth int) (int, error) {
	if depth > maxJSONDepth {
		return i, syntaxError(i, "nesting too deep")
	}
	if i >= len(b) {
		return i, syntaxError(i, "unexpected end of input")
	}
	switch c := b[i]; {
	case c == '"':
		_, _, next, _, err := scanStr(b, i)
		return next, err
	case c == '{':
		i = ws(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, nil
		}
		for {
			i = ws(b, i)
			_, _, next, _, err := scanStr(b, i)
			if err != nil {
				return next, err
			}
			i = ws(b, next)
			if i >= len(b) || b[i] != ':' {
				return i, syntaxError(i, "expected ':' after object key")
			}
			if i, err = scanMember(b, ws(b, i+1), depth+1); err != nil {
				return i, err
			}
			i = ws(b, i)
			if i >= len(b) {
				return i, syntaxError(i, "unexpected end of object")
			}
			if b[i] == ',' {
				i++
				continue
			}
			if b[i] == '}' {
				return i + 1, nil
			}
			return i, syntaxError(i, "expected ',' or '}' in object")
		}
	case c == '[':
		i = ws(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, nil
		}
		for {
			var err error
			if i, err = scanMember(b, ws(b, i), depth+1); err != nil {
				return i, err
			}
			i = ws(b, i)
			if i >= len(b) {
				return i, syntaxError(i, "unexpected end of array")
			}
			if b[i] == ',' {
				i++
				continue
			}
			if b[i] == ']' {
				return i + 1, nil
			}
			return i, syntaxError(i, "expected ',' or ']' in array")
		}
	case c == 't':
		return scanLit(b, i, "true")
	case c == 'f':
		return scanLit(b, i, "false")
	case c == 'n':
		return scanLit(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNum(b, i)
	default:
		return i, syntaxError(i, "unexpected character")
	}
}

// scanMember is scanValue for a member of an object or array: strings
// and numbers, most members, without the call.
func scanMember(b []byte, i, depth int) (int, error) {
	if depth <= maxJSONDepth && i < len(b) {
		if c := b[i]; c == '"' {
			_, _, next, _, err := scanStr(b, i)
			return next, err
		} else if c == '-' || (c >= '0' && c <= '9') {
			return scanNum(b, i)
		}
	}
	return scanValue(b, i, depth)
}

func scanLit(b []byte, i int, w string) (int, error) {
	if len(b)-i < len(w) || string(b[i:i+len(w)]) != w {
		return i, syntaxError(i, "invalid literal")
	}
	return i + len(w), nil
}

// scanNum validates the number at b[i] (a '-' or a digit) and returns the
// position after it.
func scanNum(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return i, syntaxError(i, "invalid number")
	}
	if b[i] == '0' {
		i++
	} else if b[i] >= '1' && b[i] <= '9' {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	} else {
		return i, syntaxError(i, "invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		st := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == st {
			return i, syntaxError(i, "invalid number")
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
			return i, syntaxError(i, "invalid number")
		}
	}
	return i, nil
}

const (
	lo8 = 0x0101010101010101
	hi8 = 0x8080808080808080
)

// scanStr scans the string at b[i] (which must be '"'): the bounds of its
// contents, whether it has escapes, and the position after it. Sixteen
// bytes a round, eight at a time, where no quote, backslash or control byte
// is present.
func scanStr(b []byte, i int) (start, end, next int, esc bool, err error) {
	if i >= len(b) || b[i] != '"' {
		return 0, 0, i, false, syntaxError(i, "expected string")
	}
	i++
	start = i
	for {
		// lim: past it a string is long (message text carries most
		// bytes) and goes on with vectorised searches.
		lim := i + 64
	words:
		for i+16 <= len(b) {
			if i >= lim {
				end, next, e, err := strLong(b, i)
				return start, end, next, esc || e, err
			}
			w := b[i : i+16]
			// The lowest flagged byte is exact (borrows only carry
			// upwards): jump straight to it.
			if t := special(binary.LittleEndian.Uint64(w)); t != 0 {
				i += bits.TrailingZeros64(t) >> 3
				break words
			}
			if t := special(binary.LittleEndian.Uint64(w[8:])); t != 0 {
				i += 8 + bits.TrailingZeros64(t)>>3
				break words
			}
			i += 16
		}
		if i+16 > len(b) {
			// The frame's last bytes, one at a time.
			for i < len(b) && b[i] >= 0x20 && b[i] != '"' && b[i] != '\\' {
				i++
			}
			if i >= len(b) {
				return 0, 0, i, false, syntaxError(i, "unterminated string")
			}
		}
		switch c := b[i]; {
		case c == '"':
			return start, i, i + 1, esc, nil
		case c == '\\':
			esc = true
			n, err := escape(b, i)
			if err != nil {
				return 0, 0, i, false, err
			}
			i += n
		case c < 0x20:
			return 0, 0, i, false, syntaxError(i, "control character in string")
		default:
			i++
		}
	}
}

// strLong finishes a string from b[i] in time linear in its length: the
// next quote and the next backslash are found with IndexByte, the clean
// runs between them checked for control bytes, and a quote position is
// searched again only once an escape has passed it. It returns where the
// contents end and the position after the closing quote.
func strLong(b []byte, i int) (end, next int, esc bool, err error) {
	q := -1 // absolute position of the next unescaped-looking quote
	for {
		if q < i {
			rel := bytes.IndexByte(b[i:], '"')
			if rel < 0 {
				return 0, len(b), false, syntaxError(len(b), "unterminated string")
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
			return 0, i, false, syntaxError(i, "control character in string")
		}
		if clean == q {
			return q, q + 1, esc, nil
		}
		esc = true
		n, err := escape(b, clean)
		if err != nil {
			return 0, clean, false, err
		}
		i = clean + n
	}
}

// escape validates the escape sequence at b[i] (a backslash) and returns
// its length.
func escape(b []byte, i int) (int, error) {
	if i+1 >= len(b) {
		return 0, syntaxError(i, "unterminated string")
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		if i+6 > len(b) || !isHex4(b[i+2:i+6]) {
			return 0, syntaxError(i, "invalid \\u escape")
		}
		return 6, nil
	}
	return 0, syntaxError(i, "invalid escape")
}

// special flags (high bit set) the bytes of x that are a quote, a
// backslash or a control byte; 0 when there is none.
func special(x uint64) uint64 {
	q := x ^ (lo8 * '"')
	bs := x ^ (lo8 * '\\')
	return (((x - lo8*0x20) & ^x) | ((q - lo8) & ^q) | ((bs - lo8) & ^bs)) & hi8
}

// hasControl: some byte of b is below 0x20 (forbidden raw in a string).
// Message text carries most of a flood's bytes, so this runs over 32 bytes
// a round with one test, slicing as it goes so no index is bounds-checked.
func hasControl(b []byte) bool {
	for len(b) >= 32 {
		x0 := binary.LittleEndian.Uint64(b)
		x1 := binary.LittleEndian.Uint64(b[8:])
		x2 := binary.LittleEndian.Uint64(b[16:])
		x3 := binary.LittleEndian.Uint64(b[24:])
		if ((x0-lo8*0x20)&^x0|(x1-lo8*0x20)&^x1|(x2-lo8*0x20)&^x2|(x3-lo8*0x20)&^x3)&hi8 != 0 {
			return true
		}
		b = b[32:]
	}
	for len(b) >= 8 {
		x := binary.LittleEndian.Uint64(b)
		if (x-lo8*0x20)&^x&hi8 != 0 {
			return true
		}
		b = b[8:]
	}
	for _, c := range b {
		if c < 0x20 {
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
