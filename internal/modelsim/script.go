package modelsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

const (
	// maxBig bounds [[big:N]] so a typo cannot make the server build gigabytes.
	maxBig = 64 << 20
	// chunkMax bounds one streamed text or argument piece. Agents repeat the
	// whole partial message in every update, so big answers come in few pieces.
	chunkMax = 256 << 10
	// pieces is how many pieces a short text or argument string is streamed in, so clients
	// always have to reassemble.
	pieces = 4
	// echoBytes is how much of the user message the default answer repeats.
	echoBytes = 40
	// bigFiller starts the text [[big:N]] writes; numbered words follow,
	// so the text never repeats itself (omp stops answers it sees looping).
	bigFiller = "lorem ipsum "
)

// plannedCall is a tool call the answer will make.
type plannedCall struct {
	name string
	args string // compact JSON object
}

// plan is the scripted answer to one request.
type plan struct {
	status int // non-zero: answer with this HTTP error instead
	text   string
	calls  []plannedCall
	delay  time.Duration // between streamed chunks
}

// directives are the [[...]] instructions found in one user message.
type directives struct {
	calls   []plannedCall
	say     *string
	after   *string
	big     int // -1: none
	slow    time.Duration
	status  int
	statusN int
}

// parseDirectives scans text for [[name:...]] directives. Unknown names and text without a
// colon are left alone as ordinary text; a known directive with a bad value is an error.
func parseDirectives(text string) (directives, error) {
	d := directives{big: -1}
	rest := text
	for {
		i := strings.Index(rest, "[[")
		if i < 0 {
			return d, nil
		}
		rest = rest[i+2:]
		name, body, ok := strings.Cut(rest, ":")
		if !ok || !isDirectiveName(name) {
			continue
		}
		var consumed int
		var err error
		if name == "tool" {
			var call plannedCall
			call, consumed, err = parseTool(body)
			d.calls = append(d.calls, call)
		} else {
			val, _, found := strings.Cut(body, "]]")
			if !found {
				return d, fmt.Errorf("%w: directive [[%s: has no closing ]]", errBadRequest, name)
			}
			consumed = len(val) + 2
			err = d.set(name, val)
		}
		if err != nil {
			return d, err
		}
		rest = body[consumed:]
	}
}

func isDirectiveName(name string) bool {
	switch name {
	case "tool", "say", "after", "big", "slow", "status":
		return true
	}
	return false
}

// set applies one non-tool directive. The first say and after win; later ones are ignored.
func (d *directives) set(name, val string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: directive [[%s:%s]]: %s", errBadRequest, name, val, why)
	}
	switch name {
	case "say":
		if d.say == nil {
			d.say = &val
		}
	case "after":
		if d.after == nil {
			d.after = &val
		}
	case "big":
		n, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil || n < 0 || n > maxBig {
			return bad(fmt.Sprintf("want a byte count from 0 to %d", maxBig))
		}
		d.big = n
	case "slow":
		dur, err := time.ParseDuration(strings.TrimSpace(val))
		if err != nil || dur < 0 {
			return bad("want a Go duration such as 50ms")
		}
		d.slow = dur
	case "status":
		codeText, times, hasTimes := strings.Cut(strings.TrimSpace(val), " ")
		code, err := strconv.Atoi(codeText)
		if err != nil || code < 400 || code > 599 {
			return bad("want an HTTP error code from 400 to 599")
		}
		n := 1
		if hasTimes {
			t, ok := strings.CutPrefix(strings.TrimSpace(times), "x")
			n, err = strconv.Atoi(t)
			if !ok || err != nil || n < 1 {
				return bad("want CODE or CODE xN with N ≥ 1")
			}
		}
		d.status, d.statusN = code, n
	}
	return nil
}

// parseTool parses the part after "[[tool:": NAME, then optionally a JSON object, then "]]".
// It returns how many bytes of s it used. The JSON is decoded rather than cut at "]]" so that
// arguments may contain "]]".
func parseTool(s string) (plannedCall, int, error) {
	end := strings.IndexAny(s, " \t\n]")
	if end <= 0 {
		return plannedCall{}, 0, fmt.Errorf("%w: directive [[tool: needs a tool name", errBadRequest)
	}
	call := plannedCall{name: s[:end], args: "{}"}
	pos := end
	for pos < len(s) && strings.ContainsRune(" \t\n", rune(s[pos])) {
		pos++
	}
	if !strings.HasPrefix(s[pos:], "]]") {
		dec := json.NewDecoder(strings.NewReader(s[pos:]))
		var args json.RawMessage
		if err := dec.Decode(&args); err != nil {
			return plannedCall{}, 0, fmt.Errorf("%w: directive [[tool:%s]]: arguments are not JSON: %w", errBadRequest, call.name, err)
		}
		if bytes.TrimSpace(args)[0] != '{' {
			return plannedCall{}, 0, fmt.Errorf("%w: directive [[tool:%s]]: arguments must be a JSON object", errBadRequest, call.name)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, args); err != nil {
			return plannedCall{}, 0, fmt.Errorf("%w: directive [[tool:%s]]: %w", errBadRequest, call.name, err)
		}
		call.args = buf.String()
		pos += int(dec.InputOffset())
		for pos < len(s) && strings.ContainsRune(" \t\n", rune(s[pos])) {
			pos++
		}
	}
	if !strings.HasPrefix(s[pos:], "]]") {
		return plannedCall{}, 0, fmt.Errorf("%w: directive [[tool:%s ...]] has no closing ]]", errBadRequest, call.name)
	}
	return call, pos + 2, nil
}

// decide scripts the answer to req (see [Server] for the rules).
func (s *Server) decide(req Request) (plan, error) {
	last := req.Messages[len(req.Messages)-1]
	var user string
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i].Role == "user" {
			user = stripReminders(req.Messages[i].Content)
			break
		}
	}
	d, err := parseDirectives(user)
	if err != nil {
		return plan{}, err
	}
	p := plan{delay: max(s.opts.ChunkDelay, d.slow)}

	if last.Role == "tool" {
		p.text = "done"
		if d.after != nil {
			p.text = *d.after
		}
		return p, nil
	}
	if d.status != 0 && s.statusHit(user, d.statusN) {
		p.status = d.status
		return p, nil
	}
	// Side requests (title generation, summaries) offer no tools: answering them with a call
	// would derail the agent, so they get text.
	if len(req.Tools) > 0 {
		p.calls = d.calls
	}
	switch {
	case d.big >= 0:
		p.text = bigText(d.big)
	case d.say != nil:
		p.text = *d.say
	case len(p.calls) > 0:
	default:
		p.text = "ok: " + prefix(user, echoBytes)
	}
	return p, nil
}

// contextTags are the blocks agents put before the user's text: omp's <system-reminder> (date and
// working directory) and copilot's <current_datetime>.
var contextTags = []string{"system-reminder", "current_datetime"}

// stripReminders drops the context blocks agents put before the user's text, so echoes and
// [[status]] counts see the same text whichever agent sent it.
func stripReminders(s string) string {
	for {
		t := strings.TrimLeft(s, " \t\r\n")
		stripped := false
		for _, tag := range contextTags {
			if !strings.HasPrefix(t, "<"+tag+">") {
				continue
			}
			if _, after, ok := strings.Cut(t, "</"+tag+">"); ok {
				s, stripped = strings.TrimLeft(after, " \t\r\n"), true
			}
			break
		}
		if !stripped {
			return s
		}
	}
}

// bigText returns exactly n bytes: the filler, then numbered words ("w0 w1 w2 ..."). The
// numbers matter: omp's loop guard aborts and retries a stream whose tail is one unit repeated
// byte for byte, which plain repetition of the filler would be.
func bigText(n int) string {
	var b strings.Builder
	b.Grow(n + 16)
	b.WriteString(bigFiller)
	for i := 0; b.Len() < n; i++ {
		b.WriteString("w")
		b.WriteString(strconv.Itoa(i))
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

// prefix returns at most n bytes of s, cut at a character boundary.
func prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// split cuts s into pieces for streaming: short strings into up to [pieces] parts, long ones into
// parts of at most [chunkMax] bytes, always at character boundaries.
func split(s string) []string {
	if s == "" {
		return nil
	}
	size := min(max((len(s)+pieces-1)/pieces, 1), chunkMax)
	var out []string
	for len(s) > 0 {
		n := min(size, len(s))
		// Back off to a character boundary so a piece never splits a character (a character is
		// at most 4 bytes, so this keeps valid text within size); if that leaves nothing, as
		// with a tiny size or invalid UTF-8, move forward instead.
		m := n
		for m > 0 && m > n-utf8.UTFMax && m < len(s) && !utf8.RuneStart(s[m]) {
			m--
		}
		if m > 0 && (m == len(s) || utf8.RuneStart(s[m])) {
			n = m
		} else {
			for k := 1; k < utf8.UTFMax && n < len(s) && !utf8.RuneStart(s[n]); k++ {
				n++
			}
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}
