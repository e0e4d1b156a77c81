package room

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxIDLen bounds a room id, in characters (Unicode code points, as JSON
// Schema's maxLength counts them), so at most 4*MaxIDLen bytes of UTF-8.
const MaxIDLen = 128

// ErrBadID is returned for a room id that is not valid.
var ErrBadID = errors.New("room: invalid room id")

// ValidateID says why id cannot name a room, or nil. An id is 1 to
// MaxIDLen characters of printable UTF-8 with no slash, backslash or control
// character, not "." or "..", and not starting or ending with a space.
// Ids are case-sensitive: "A" and "a" are two rooms.
func ValidateID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrBadID)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not UTF-8", ErrBadID)
	case utf8.RuneCountInString(id) > MaxIDLen:
		return fmt.Errorf("%w: longer than %d characters", ErrBadID, MaxIDLen)
	case id == "." || id == "..":
		return fmt.Errorf("%w: %q", ErrBadID, id)
	case strings.TrimSpace(id) != id:
		return fmt.Errorf("%w: leading or trailing space", ErrBadID)
	}
	for _, r := range id {
		if r == '/' || r == '\\' || unicode.IsControl(r) || !unicode.IsPrint(r) && r != ' ' {
			return fmt.Errorf("%w: character %U", ErrBadID, r)
		}
	}
	return nil
}

// dirName maps a valid room id to a directory name that is safe on any
// file system and unique per id: a readable prefix of the id's plain
// characters, lower-cased, then a hash of the exact id, so ids that differ
// only in case, or in characters the prefix drops, never share a folder.
func dirName(id string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(id) {
		if b.Len() >= 40 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == '.' && b.Len() > 0:
			b.WriteRune(r)
		}
	}
	sum := sha256.Sum256([]byte(id))
	if b.Len() > 0 {
		b.WriteByte('-')
	}
	b.WriteString(hex.EncodeToString(sum[:10]))
	return b.String()
}
