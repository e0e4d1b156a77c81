package gitws

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
	"unicode"
)

// Spec is a room's workspace from git: the repository's URL and the ref to check out.
type Spec struct {
	// Git is the repository's URL: file:///path, https://host/path or ssh (ssh://[user@]host/path
	// or the scp-like user@host:path). Credentials never go in it: a user name or password in a
	// file:// or https:// URL (a token is often given as the user name) and a password in an ssh
	// URL are refused, and the host's own git configuration (credential helpers, ssh agent)
	// supplies them. An ssh user name (git@host:path) is no secret and is kept.
	Git string `json:"git"`
	// Ref is a branch, a tag (tried in that order) or a commit id (4 to 64 hex digits).
	Ref string `json:"ref"`
}

// Limits on what a Spec may hold.
const (
	maxURLLen = 2048
	maxRefLen = 255
)

// remote is a checked Spec.Git.
type remote struct {
	raw      string // as given: what records and settings keep
	redacted string // without userinfo: what messages and logs show
	key      string // the mirror's name: a hash of the normalised URL
	file     string // a file:// URL's path (absolute, with no "." or ".." component)
	// arg is what git is run with: raw, or for a file:// URL the folder its path resolves to
	// now (see Engine.checkFile), so that git opens the repository that was checked.
	arg string
}

// hexRef matches a commit id (abbreviated or full SHA-1, full SHA-256).
var hexRef = regexp.MustCompile(`^[0-9a-fA-F]{4,64}$`)

// scpLike matches git's scp-like ssh syntax, [user@]host:path, whose host is a plain name.
var scpLike = regexp.MustCompile(`^(?:([A-Za-z0-9._~-]+)@)?([A-Za-z0-9][A-Za-z0-9.-]*):(.+)$`)

// parseRemote checks a repository URL: only file://, https:// and ssh (URL or scp-like) are
// taken; transport helpers (ext::, fd::, ...), local paths without file://, option-like values
// and credentials in the URL are refused with [ErrBadSpec].
func parseRemote(s string) (remote, error) {
	bad := func(why string) (remote, error) {
		return remote{}, fmt.Errorf("%w: git URL %q: %s", ErrBadSpec, Redact(s), why)
	}
	switch {
	case s == "":
		return remote{}, fmt.Errorf("%w: empty git URL", ErrBadSpec)
	case len(s) > maxURLLen:
		return remote{}, fmt.Errorf("%w: git URL longer than %d bytes", ErrBadSpec, maxURLLen)
	case strings.HasPrefix(s, "-"):
		return bad("looks like an option")
	case strings.IndexFunc(s, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) }) >= 0:
		return bad("has spaces or control characters")
	}
	// git reads <transport>::<address> as a remote helper (ext:: runs a command, fd:: uses
	// descriptors): none is wanted.
	if i := strings.Index(s, "::"); i >= 0 && !strings.Contains(s[:i], "/") {
		return bad("remote helpers (" + s[:i] + "::) are not allowed")
	}
	if !strings.Contains(s, "://") {
		m := scpLike.FindStringSubmatch(s)
		// A one-letter "host" is a drive letter (C:\repo) to git on Windows.
		if m == nil || len(m[2]) < 2 || strings.HasPrefix(m[3], "-") {
			return bad("not a file://, https:// or ssh URL (local paths need file://)")
		}
		user, host, p := m[1], strings.ToLower(m[2]), m[3]
		redacted := host + ":" + p
		norm := "ssh://" + host + "/" + strings.TrimRight(p, "/")
		if user != "" {
			norm = "ssh://" + user + "@" + host + "/" + strings.TrimRight(p, "/")
		}
		return remote{raw: s, redacted: redacted, key: mirrorKey(norm), arg: s}, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return bad("not a URL")
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "file" && scheme != "https" && scheme != "ssh" {
		return bad("scheme " + u.Scheme + " is not file, https or ssh")
	}
	// Whatever is in the URL is stored with the room's settings and shown by GET /config: a
	// token there (https://<token>@host/..., the usual form for GitHub and GitLab) would be too.
	if _, set := u.User.Password(); set || (u.User != nil && scheme != "ssh") {
		return bad("has a user name or password: credentials never go in the URL (it is stored and shown); " +
			"give them to the server's git instead (a credential helper in its git configuration, or an ssh key)")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return bad("has a query or fragment")
	}
	host := strings.ToLower(u.Host)
	if strings.HasPrefix(host, "-") || strings.HasPrefix(u.Path, "-") || strings.HasPrefix(u.User.Username(), "-") {
		return bad("looks like an option")
	}
	switch scheme {
	case "file":
		if host != "" && host != "localhost" {
			return bad("file:// URLs name no host")
		}
		if !path.IsAbs(u.Path) {
			return bad("file:// needs an absolute path")
		}
		// The path is checked as named and then resolved (links followed) before git opens
		// it: a "." or ".." component would be read one way here and another way by the
		// kernel after a link.
		for part := range strings.SplitSeq(u.Path[1:], "/") {
			if part == "." || part == ".." {
				return bad(`file:// path has a "." or ".." component`)
			}
		}
		host = ""
	default:
		if u.Hostname() == "" {
			return bad("no host")
		}
		if u.Path == "" || u.Path == "/" {
			return bad("no repository path")
		}
	}
	// The default ports name the same server.
	if (scheme == "https" && u.Port() == "443") || (scheme == "ssh" && u.Port() == "22") {
		host = strings.ToLower(u.Hostname())
	}
	p := path.Clean(u.Path)
	norm := scheme + "://"
	if u.User != nil {
		norm += u.User.Username() + "@"
	}
	norm += host + p
	red := *u
	red.User = nil
	rm := remote{raw: s, redacted: red.String(), key: mirrorKey(norm), arg: s}
	if scheme == "file" {
		rm.file = p
	}
	return rm, nil
}

// mirrorKey names the mirror of a normalised URL.
func mirrorKey(norm string) string {
	sum := sha256.Sum256([]byte(norm))
	return hex.EncodeToString(sum[:16])
}

// checkRef checks a ref's syntax against git's rules for ref names (check-ref-format) and
// refuses what git would read as an expression (HEAD~1, a@{u}, ^, :path) or an option.
func checkRef(ref string) error {
	bad := func(why string) error { return fmt.Errorf("%w: ref %q: %s", ErrBadSpec, ref, why) }
	switch {
	case ref == "":
		return fmt.Errorf("%w: empty ref", ErrBadSpec)
	case len(ref) > maxRefLen:
		return fmt.Errorf("%w: ref longer than %d bytes", ErrBadSpec, maxRefLen)
	case strings.HasPrefix(ref, "-"):
		return bad("looks like an option")
	case ref == "@" || ref == "HEAD":
		return bad("name a branch, tag or commit")
	case strings.Contains(ref, ".."), strings.Contains(ref, "@{"), strings.Contains(ref, "//"):
		return bad(`has "..", "@{" or "//"`)
	case strings.HasPrefix(ref, "/"), strings.HasSuffix(ref, "/"), strings.HasSuffix(ref, "."), strings.HasSuffix(ref, ".lock"):
		return bad(`starts or ends with "/", or ends with "." or ".lock"`)
	}
	for _, r := range ref {
		if r < 0x20 || r == 0x7f || strings.ContainsRune(" ~^:?*[\\", r) {
			return bad(fmt.Sprintf("has %q", r))
		}
	}
	for part := range strings.SplitSeq(ref, "/") {
		if strings.HasPrefix(part, ".") {
			return bad(`a component starts with "."`)
		}
	}
	return nil
}

// userinfo matches the userinfo of a URL inside a text (git's messages quote URLs).
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'"]+@`)

// Redact removes the userinfo (user names, passwords, tokens) of every URL in s. Every message
// and log line this package writes passes through it.
func Redact(s string) string { return userinfo.ReplaceAllString(s, "$1") }
