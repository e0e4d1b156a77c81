// Package detail prepares what an agent says about a tool call for a room's
// record: credentials redacted, the text bounded. Both transports use it.
package detail

import (
	"fmt"
	"regexp"
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
	cut := max
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… [%d bytes cut]", len(s)-cut)
}
