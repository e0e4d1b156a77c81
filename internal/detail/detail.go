// Package detail prepares what an agent says about a tool call for a room's
// record: credentials redacted, the text bounded. Both transports use it for
// every agent-supplied string that reaches a room's log (tool names, titles,
// inputs and outputs, option labels, question titles).
package detail

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// Bounds for what a room records of an agent's words.
const (
	// MaxName bounds a short name: a tool's name or kind, an option's label.
	MaxName = 128
	// MaxNames bounds how many options of a request are recorded.
	MaxNames = 32
	// scanFactor: Text redacts at most this many times max bytes of its
	// input (the regexp would otherwise run over megabytes it then cuts).
	scanFactor = 4
)

// secretPattern finds values that look like credentials ("token=...",
// "Authorization: Bearer ...", long key-like words).
const secretPattern = `(?i)((?:api[_-]?key|token|secret|password|passwd|authorization)["']?\s*[:=]\s*["']?(?:bearer\s+)?)[^\s"']+|\b(?:sk|ghp|gho|xox[bp])[-_][A-Za-z0-9_-]{12,}`

var (
	secretRE = regexp.MustCompile(secretPattern)
	// anchoredRE is secretRE tried at one place only: its input's start.
	anchoredRE = regexp.MustCompile(`^(?:` + secretPattern + `)`)
)

// keywords start every match of secretPattern, ASCII letters in lower
// case: the names of its first alternative, the prefixes of its second.
var keywords = []string{"api", "token", "secret", "passw", "authorization", "sk", "ghp", "gho", "xox"}

// Redact replaces what looks like a credential in s with "[redacted]",
// keeping the name before it ("token=", "Authorization: Bearer ").
//
// It replaces exactly the matches of secretRE over the whole of s, but
// runs the regular expression only where a keyword starts: Go's regexp
// scans an unanchored pattern at about 5 MB/s, and most text holds no
// keyword.
func Redact(s string) string {
	// Case folding takes two non-ASCII runes to ASCII letters of the
	// keywords (ſ to s, the Kelvin sign to k); the lower-case search
	// below would miss them.
	if strings.Contains(s, "\u017f") || strings.Contains(s, "\u212a") {
		return redact(s, secretRE.FindAllStringSubmatchIndex(s, -1))
	}
	var ms [][]int
	done := 0 // the end of the last match
	for _, p := range candidates(s) {
		if p < done {
			continue
		}
		m := anchoredRE.FindStringSubmatchIndex(s[p:])
		if m == nil {
			continue
		}
		// The second alternative starts at a word boundary (ASCII
		// words, as regexp's \b); anchored, its input's start is one.
		if m[2] < 0 && p > 0 && isWordByte(s[p-1]) {
			continue
		}
		for i := range m {
			if m[i] >= 0 {
				m[i] += p
			}
		}
		ms = append(ms, m)
		done = m[1]
	}
	return redact(s, ms)
}

// redact replaces each match of ms (secretRE's submatch offsets, in order,
// apart) with "[redacted]", after its name (the first group) if it has one.
// The name comes from the match in place: matched again alone, a match
// that starts at a word boundary in s may not match at all.
func redact(s string, ms [][]int) string {
	if len(ms) == 0 {
		return s
	}
	var b strings.Builder
	last := 0
	for _, m := range ms {
		b.WriteString(s[last:m[0]])
		if m[2] >= 0 {
			b.WriteString(s[m[2]:m[3]])
		}
		b.WriteString("[redacted]")
		last = m[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

// candidates are the offsets in s where a keyword starts, in any ASCII
// case, in order.
func candidates(s string) []int {
	lower := []byte(s)
	for i, c := range lower {
		if 'A' <= c && c <= 'Z' {
			lower[i] = c + 'a' - 'A'
		}
	}
	var at []int
	for _, k := range keywords {
		for i := 0; ; {
			j := bytes.Index(lower[i:], []byte(k))
			if j < 0 {
				break
			}
			at = append(at, i+j)
			i += j + 1
		}
	}
	slices.Sort(at)
	return slices.Compact(at)
}

func isWordByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// Bound cuts s to max bytes on a rune boundary, saying how much was cut.
func Bound(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := runeCut(s, max)
	return s[:cut] + fmt.Sprintf("… [%d bytes cut]", len(s)-cut)
}

// Text is s redacted and bounded to max bytes (plus the note saying how
// long s was): what a room records of an agent's title, input or output.
// Redaction comes first, so a cut never splits a credential it would have
// caught.
func Text(s string, max int) string {
	n := len(s)
	if n > scanFactor*max {
		s = s[:runeCut(s, scanFactor*max)]
	}
	s = Redact(s)
	if len(s) <= max && n <= scanFactor*max {
		return s
	}
	return s[:runeCut(s, max)] + fmt.Sprintf("… [cut, %d bytes in all]", n)
}

// Name is a short name for the record: redacted, one line (control
// characters become spaces), at most MaxName bytes.
func Name(s string) string {
	s = Text(s, MaxName)
	if strings.IndexFunc(s, unicode.IsControl) < 0 {
		return s
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// Names is Name of each of at most MaxNames of ss (nil for none).
func Names(ss []string) []string {
	if len(ss) == 0 {
		return nil
	}
	out := make([]string, 0, min(len(ss), MaxNames))
	for _, s := range ss[:min(len(ss), MaxNames)] {
		out = append(out, Name(s))
	}
	return out
}

// runeCut returns the largest index <= max that starts a rune of s.
func runeCut(s string, max int) int {
	if max >= len(s) {
		return len(s)
	}
	cut := max
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return cut
}
