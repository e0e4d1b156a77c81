// Package detail prepares what an agent says about a tool call for a room's
// record: credentials redacted, the text bounded. Both transports use it for
// every agent-supplied string that reaches a room's log (tool names, titles,
// inputs and outputs, option labels, question titles).
package detail

import (
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

// secretPattern finds values that look like credentials. Each alternative
// has one group, the value to replace: after a credential's name
// ("token=...", "api_key": "...", "Authorization: Bearer ...", on the same
// line), a key by its prefix (sk-, ghp_, ...), and the user and password of
// a URL ("https://user:pass@host"). A name followed by a colon and a bare
// word is prose more often than a credential ("token: Permission denied"):
// see credential.
const secretPattern = `(?i)(?:api[_-]?key|access[_-]?key|token|secret|password|passwd|authorization)["']?[ \t]*[:=][ \t]*["']?(?:(?:bearer|basic)[ \t]+)?([^\s"']+)` +
	`|\b((?:sk|ghp|gho|ghs|ghu|github_pat|glpat|xox[bpas])[-_][A-Za-z0-9_-]{12,})` +
	`|://([^\s/@"']*:[^\s/@"']+)@`

var (
	secretRE = regexp.MustCompile(secretPattern)
	// anchoredRE is secretRE tried at one place only: its input's start.
	anchoredRE = regexp.MustCompile(`^(?:` + secretPattern + `)`)
)

// keywords start every match of secretPattern, ASCII letters in lower
// case: the names of its first alternative, the prefixes of its second,
// the scheme separator of its third.
var keywords = []string{"api", "access", "token", "secret", "passw", "authorization", "sk", "ghp", "gho", "ghs", "ghu", "github_pat", "glpat", "xox", "://"}

// Redact replaces what looks like a credential in s with "[redacted]",
// keeping what names it ("token=", "Authorization: Bearer ", a URL's
// scheme and host).
//
// It replaces exactly the matches of secretRE over the whole of s that
// credential keeps, but runs the regular expression only where a keyword
// starts: Go's regexp scans an unanchored pattern at about 5 MB/s, and most
// text holds no keyword.
func Redact(s string) string {
	// Case folding takes two non-ASCII runes to ASCII letters of the
	// keywords (ſ to s, the Kelvin sign to k); the lower-case search
	// below would miss them.
	if strings.Contains(s, "\u017f") || strings.Contains(s, "\u212a") {
		return redact(s, wholeScan(s))
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
		if m[4] >= 0 && p > 0 && isWordByte(s[p-1]) {
			continue
		}
		for i := range m {
			if m[i] >= 0 {
				m[i] += p
			}
		}
		// A match credential does not keep still takes its place, as in
		// the whole scan.
		done = m[1]
		if credential(s, m) {
			ms = append(ms, m)
		}
	}
	return redact(s, ms)
}

// wholeScan is the matches of secretRE over the whole of s that
// credential keeps (what Redact replaces).
func wholeScan(s string) [][]int {
	ms := secretRE.FindAllStringSubmatchIndex(s, -1)
	return slices.DeleteFunc(ms, func(m []int) bool { return !credential(s, m) })
}

// credential reports whether a match m of secretRE in s is a credential.
// A name's value is one when it is assigned ("token=x"), quoted
// ("token": "x"), a bearer or basic credential, or, after a colon, a word
// that looks like a key: six bytes or more with a digit or one of -_/+=~
// ("password: hunter2", not "token: Permission denied").
func credential(s string, m []int) bool {
	if m[2] < 0 {
		return true // a key by its prefix, a URL's user and password
	}
	name, value := s[m[0]:m[2]], s[m[2]:m[3]]
	scheme := strings.ToLower(strings.TrimRight(name, " \t"))
	if strings.Contains(name, "=") || strings.HasSuffix(name, `"`) || strings.HasSuffix(name, "'") ||
		strings.HasSuffix(scheme, "bearer") || strings.HasSuffix(scheme, "basic") {
		return true
	}
	value = strings.TrimRight(value, ".,;:!?)]}")
	return len(value) >= 6 && strings.ContainsAny(value, "0123456789-_/+=~")
}

// redact replaces the value of each match of ms (secretRE's submatch
// offsets, in order, apart: the one group that took part) with
// "[redacted]", keeping the rest of the match.
func redact(s string, ms [][]int) string {
	if len(ms) == 0 {
		return s
	}
	var b strings.Builder
	last := 0
	for _, m := range ms {
		for g := 2; g+1 < len(m); g += 2 {
			if m[g] >= 0 {
				b.WriteString(s[last:m[g]])
				b.WriteString("[redacted]")
				last = m[g+1]
				break
			}
		}
	}
	b.WriteString(s[last:])
	return b.String()
}

// candidates are the offsets in s where a keyword starts, in any ASCII
// case, in order: one pass over s, comparing only where a keyword's first
// byte is.
func candidates(s string) []int {
	var at []int
	for i := 0; i < len(s); i++ {
		for _, k := range byFirst[lowerByte(s[i])] {
			if hasPrefixFold(s[i:], k) {
				at = append(at, i)
				break
			}
		}
	}
	return at
}

// byFirst groups the keywords by their first byte.
var byFirst = func() (t [256][]string) {
	for _, k := range keywords {
		t[k[0]] = append(t[k[0]], k)
	}
	return t
}()

// hasPrefixFold reports whether s starts with the lower-case ASCII k, in
// any ASCII case.
func hasPrefixFold(s, k string) bool {
	if len(s) < len(k) {
		return false
	}
	for i := 0; i < len(k); i++ {
		if lowerByte(s[i]) != k[i] {
			return false
		}
	}
	return true
}

func lowerByte(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
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
