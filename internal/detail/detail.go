// Package detail prepares what an agent says about a tool call for a room's
// record: credentials redacted, the text bounded. Both transports use it for
// every agent-supplied string that reaches a room's log (tool names, titles,
// inputs and outputs, option labels, question titles).
package detail

import (
	"fmt"
	"regexp"
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

// secretRE finds values that look like credentials ("token=...",
// "Authorization: Bearer ...", long key-like words).
var secretRE = regexp.MustCompile(`(?i)((?:api[_-]?key|token|secret|password|passwd|authorization)["']?\s*[:=]\s*["']?(?:bearer\s+)?)[^\s"']+|\b(?:sk|ghp|gho|xox[bp])[-_][A-Za-z0-9_-]{12,}`)

// Redact replaces what looks like a credential in s with "[redacted]".
func Redact(s string) string {
	return secretRE.ReplaceAllStringFunc(s, func(m string) string {
		if sub := secretRE.FindStringSubmatch(m); sub[1] != "" {
			return sub[1] + "[redacted]"
		}
		return "[redacted]"
	})
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
