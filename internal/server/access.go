package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// Room tokens: the admin token (Options.Token) creates tokens that reach
// only the rooms they name, with only the permissions they name, until
// they expire or are revoked. Only the SHA-256 of a token's secret is
// stored: the secret is 256 random bits, so there is nothing a slow hash
// would protect (it guards guessable passwords), and a fast one costs a
// request a microsecond. A request's token is found by its hash in a map:
// the time of that lookup tells a caller at most about hashes, which do
// not help find a secret; the admin token is compared in constant time.

// The permissions a room token can hold.
const (
	PermRead      = "read"      // the room, its messages, turns, events, diffs and settings
	PermSend      = "send"      // post messages, cancel the turn
	PermApprove   = "approve"   // resolve approvals and answer questions
	PermConfigure = "configure" // put settings, revert a turn
	PermRelease   = "release"   // release the room's agent (DELETE without purge)
	PermPurge     = "purge"     // delete the room for good (DELETE ?purge=true)
)

// Perms are every permission, in the order they are listed.
var Perms = []string{PermRead, PermSend, PermApprove, PermConfigure, PermRelease, PermPurge}

// scope is what a route asks of a token.
type scope struct {
	open  bool   // no token at all
	admin bool   // the admin token only
	any   bool   // any valid token (no room, no permission)
	perm  string // the permission, in the path's {room} (or, for the rooms list, in the rooms listed)
}

// scopes maps every route to what it needs: the one place to read who may
// do what. A route missing here is refused to every room token.
var scopes = map[string]scope{
	"GET /{$}":                                  {open: true},
	"GET /healthz":                              {open: true},
	"GET /metrics":                              {admin: true},
	"GET /v1/openapi.json":                      {any: true},
	"GET /v1/token":                             {any: true}, // the caller's own scope
	"GET /v1/tokens":                            {admin: true},
	"POST /v1/tokens":                           {admin: true},
	"DELETE /v1/tokens/{id}":                    {admin: true},
	"GET /v1/rooms":                             {perm: PermRead}, // lists only the token's rooms
	"GET /v1/rooms/{room}":                      {perm: PermRead},
	"DELETE /v1/rooms/{room}":                   {perm: PermRelease}, // PermPurge with ?purge=true
	"POST /v1/rooms/{room}/messages":            {perm: PermSend},
	"GET /v1/rooms/{room}/messages":             {perm: PermRead},
	"GET /v1/rooms/{room}/turns":                {perm: PermRead},
	"POST /v1/rooms/{room}/cancel":              {perm: PermSend},
	"POST /v1/rooms/{room}/approvals/{id}":      {perm: PermApprove},
	"POST /v1/rooms/{room}/questions/{id}":      {perm: PermApprove},
	"GET /v1/rooms/{room}/events":               {perm: PermRead},
	"GET /v1/rooms/{room}/config":               {perm: PermRead},
	"PUT /v1/rooms/{room}/config":               {perm: PermConfigure},
	"GET /v1/rooms/{room}/turns/{turn}/diff":    {perm: PermRead},
	"POST /v1/rooms/{room}/turns/{turn}/revert": {perm: PermConfigure},
}

// Limits of a token's request.
const (
	// DefaultTokenExpiry is a token's life when expires_in is left out.
	DefaultTokenExpiry = 24 * time.Hour
	// MaxTokenExpiry bounds a token's life.
	MaxTokenExpiry = 366 * 24 * time.Hour
	// MinTokenExpiry is a token's shortest life.
	MinTokenExpiry = time.Second
	// MaxTokenRooms bounds the room ids and patterns of a token.
	MaxTokenRooms = 100
	// maxTokenLabel bounds a token's label, in characters.
	maxTokenLabel = 256
	// tokenPrefix starts every room token's secret: a leaked one is
	// recognisable (secret scanners), and never mistaken for an admin
	// token the operator chose.
	tokenPrefix = "aht_"
)

// A room token's rate limits (Options.TokenMessagesPerMinute and
// TokenStreams): a person at a page sends a few messages a minute and
// keeps a stream or two open (a tab each); a script looping on a leaked
// token meets the bound.
const (
	DefaultTokenMessagesPerMinute = 30
	DefaultTokenStreams           = 8
)

// TokenStore keeps room tokens (store.Tokens is the SQLite one).
type TokenStore interface {
	CreateToken(ctx context.Context, t store.Token) error
	AllTokens(ctx context.Context) ([]store.Token, error)
	RevokeToken(ctx context.Context, id string, at time.Time) error
}

// TokenFeed is a TokenStore that other servers write too (a cluster's,
// natsroom.Tokens): the server follows it, so that a token created
// through another node works here, and one revoked there is refused here
// and its open streams here end, as soon as the change arrives.
type TokenFeed interface {
	TokenStore
	// WatchTokens calls changed with every token stored, then returns,
	// and goes on calling it with each token created or changed until
	// ctx ends or stop is called (stop waits for the last call). changed
	// may see a token it knows again.
	WatchTokens(ctx context.Context, changed func(store.Token)) (stop func(), err error)
}

// grant is a room token the server knows. ctx ends when it expires or is
// revoked: the requests it runs (an event stream) end with it.
type grant struct {
	store.Token
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// Token.Revoked is written under mu (revoke); the rest of Token never
	// changes.
	// sent are the times of the messages of the last minute (at most
	// the limit: the bound of the slice).
	sent    []time.Time
	streams int // event streams open
}

// revokedAt answers when the token was revoked (zero: it was not).
func (g *grant) revokedAt() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.Revoked
}

// revoke marks the grant revoked at at (a grant revoked before keeps its
// first time) and ends its requests.
func (g *grant) revoke(at time.Time) {
	g.mu.Lock()
	if g.Revoked.IsZero() {
		g.Revoked = at
	}
	g.mu.Unlock()
	g.cancel()
}

// revokedBy is revoke with the store's time, which wins over this
// server's own (another node's revocation may have landed first).
func (g *grant) revokedBy(at time.Time) {
	g.mu.Lock()
	g.Revoked = at
	g.mu.Unlock()
	g.cancel()
}

// view is the grant's token as GET /v1/tokens lists it.
func (g *grant) view() tokenView {
	g.mu.Lock()
	defer g.mu.Unlock()
	return viewToken(g.Token)
}

// send takes a place for a message at now, or answers how long until one
// frees (the oldest of the last minute's limit messages turns a minute);
// a limit below 1 is none.
func (g *grant) send(now time.Time, limit int) time.Duration {
	if limit < 1 {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	i := 0
	for i < len(g.sent) && now.Sub(g.sent[i]) >= time.Minute {
		i++
	}
	g.sent = g.sent[i:]
	if len(g.sent) >= limit {
		return time.Minute - now.Sub(g.sent[0])
	}
	g.sent = append(g.sent, now)
	return 0
}

// stream takes a place for an event stream (false: limit are open; a
// limit below 1 is none); the caller gives it back with unstream.
func (g *grant) stream(limit int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if limit >= 1 && g.streams >= limit {
		return false
	}
	g.streams++
	return true
}

func (g *grant) unstream() {
	g.mu.Lock()
	g.streams--
	g.mu.Unlock()
}

// allows reports whether the grant reaches room id with perm.
func (g *grant) allows(id, perm string) bool {
	return slices.Contains(g.Can, perm) && roomMatches(g.Rooms, id)
}

// roomMatches reports whether id is one of pats: an exact id, or a
// "prefix*" pattern that every id starting with prefix matches.
func roomMatches(pats []string, id string) bool {
	for _, p := range pats {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(id, prefix) {
				return true
			}
		} else if p == id {
			return true
		}
	}
	return false
}

// tokens are the server's room tokens, loaded from the store at New and
// written through it (and, from a TokenFeed, followed).
type tokens struct {
	st     TokenStore
	mu     sync.Mutex // byHash, byID
	byHash map[[sha256.Size]byte]*grant
	byID   map[string]*grant
	// unwatch ends the feed's watch (a no-op without one).
	unwatch func()
	// writeMu serialises the admin's writes (create, revoke) through the
	// store; mu is taken only briefly, never across a store's call.
	writeMu sync.Mutex
}

// newTokens loads st's tokens; a TokenFeed is followed until ctx ends or
// close.
func newTokens(ctx, load context.Context, st TokenStore) (*tokens, error) {
	ts := &tokens{st: st, byHash: map[[sha256.Size]byte]*grant{}, byID: map[string]*grant{}, unwatch: func() {}}
	if st == nil {
		return ts, nil
	}
	if feed, ok := st.(TokenFeed); ok {
		// The watch's first calls are the stored tokens: nothing written
		// between a load and a watch is missed.
		lctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(load, cancel) // the load's deadline bounds the first calls only
		unwatch, err := feed.WatchTokens(lctx, ts.apply)
		stop()
		if err != nil {
			cancel()
			return nil, fmt.Errorf("server: loading the tokens: %w", err)
		}
		ts.unwatch = func() { unwatch(); cancel() }
		return ts, nil
	}
	all, err := st.AllTokens(load)
	if err != nil {
		return nil, fmt.Errorf("server: loading the tokens: %w", err)
	}
	for _, t := range all {
		ts.add(t)
	}
	return ts, nil
}

// apply takes a token the feed brought: a new one is added, a revocation
// ends the grant's requests here. A token's other fields never change.
func (ts *tokens) apply(t store.Token) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	g := ts.byID[t.ID]
	if g == nil {
		ts.add(t)
		return
	}
	if !t.Revoked.IsZero() {
		g.revokedBy(t.Revoked)
	}
}

// add keeps t (the caller holds mu, or owns ts alone).
func (ts *tokens) add(t store.Token) *grant {
	g := &grant{Token: t}
	g.ctx, g.cancel = context.WithDeadline(context.Background(), t.Expires)
	if !t.Revoked.IsZero() {
		g.cancel()
	}
	var h [sha256.Size]byte
	copy(h[:], t.Hash)
	ts.byHash[h], ts.byID[t.ID] = g, g
	return g
}

// find answers the grant of a presented secret (nil when unknown).
func (ts *tokens) find(secret string) *grant {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.byHash[sha256.Sum256([]byte(secret))]
}

// close ends the feed's watch and every grant's context (their timers).
func (ts *tokens) close() {
	ts.unwatch()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, g := range ts.byID {
		g.cancel()
	}
}

// principal is who a request is: the admin, or a room token's grant.
type principal struct{ g *grant }

type principalKey struct{}

// who answers the request's room token (nil for the admin).
func who(r *http.Request) *grant {
	p, _ := r.Context().Value(principalKey{}).(principal)
	return p.g
}

// authFor requires a token that the route's scope admits.
func (s *Server) authFor(pattern string, next http.Handler) http.Handler {
	want := []byte(s.opts.Token)
	sc, known := scopes[pattern]
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		scheme, tok, _ := strings.Cut(h, " ")
		tok = strings.TrimSpace(tok)
		bearer := strings.EqualFold(scheme, "Bearer") && tok != ""
		admin := false
		if s.opts.Authorize != nil {
			admin = s.opts.Authorize(r)
		} else {
			admin = bearer && len(want) > 0 && subtle.ConstantTimeCompare([]byte(tok), want) == 1
		}
		if admin {
			next.ServeHTTP(w, r)
			return
		}
		var g *grant
		if bearer && strings.HasPrefix(tok, tokenPrefix) {
			g = s.tokens.find(tok)
		}
		if g == nil {
			msg := "a valid bearer token is required"
			if s.opts.Authorize != nil {
				msg = "this request is not authorized"
			} else if h == "" {
				msg = "missing Authorization header: a bearer token is required"
			}
			unauthorized(w, msg)
			return
		}
		switch {
		case !g.revokedAt().IsZero():
			unauthorized(w, "this token was revoked")
			return
		case !time.Now().Before(g.Expires):
			unauthorized(w, "this token expired at "+g.Expires.UTC().Format(time.RFC3339))
			return
		}
		if reason := sc.refuse(g, r, known); reason != "" {
			writeError(w, http.StatusForbidden, reason)
			return
		}
		switch pattern {
		case "POST /v1/rooms/{room}/messages":
			if wait := g.send(time.Now(), s.opts.TokenMessagesPerMinute); wait > 0 {
				secs := int((wait + time.Second - 1) / time.Second)
				w.Header().Set("Retry-After", strconv.Itoa(secs))
				writeError(w, http.StatusTooManyRequests, fmt.Sprintf("token rate limit: this token sent %d messages in the last minute, its limit; the next may come in %ds",
					s.opts.TokenMessagesPerMinute, secs))
				return
			}
		case "GET /v1/rooms/{room}/events":
			if !g.stream(s.opts.TokenStreams) {
				// A stream frees when its reader leaves.
				w.Header().Set("Retry-After", "5")
				writeError(w, http.StatusTooManyRequests, fmt.Sprintf("token rate limit: this token has %d event streams open, its limit; close one", s.opts.TokenStreams))
				return
			}
			defer g.unstream()
		}
		// The request (an event stream) ends when the token is revoked or
		// expires.
		// The events it causes name it (never its secret).
		ctx := room.WithToken(context.WithValue(r.Context(), principalKey{}, principal{g}), event.TokenRef{ID: g.ID, Label: g.Label})
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		stop := context.AfterFunc(g.ctx, func() { cancel(errTokenEnded) })
		defer stop()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// errTokenEnded is the cause of a request's end when its token was
// revoked or expired while it ran: fail answers 401, not the 503 of a
// request cut short.
var errTokenEnded = errors.New("the request's token was revoked or expired")

// tokenEnded says why r's token ended while r ran ("" if it did not).
func tokenEnded(r *http.Request) string {
	g := who(r)
	if g == nil || !errors.Is(context.Cause(r.Context()), errTokenEnded) {
		return ""
	}
	if !g.revokedAt().IsZero() {
		return "this token was revoked"
	}
	return "this token expired at " + g.Expires.UTC().Format(time.RFC3339)
}

func unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="agenthost"`)
	// A client without the token keeps no connection open.
	w.Header().Set("Connection", "close")
	writeError(w, http.StatusUnauthorized, msg)
}

// refuse says why g may not make request r ("" when it may).
func (sc scope) refuse(g *grant, r *http.Request, known bool) string {
	switch {
	case !known || sc.admin:
		return "this route needs the admin token"
	case sc.any:
		return ""
	}
	perm := sc.perm
	if r.Method == http.MethodDelete && r.PathValue("room") != "" {
		if v := r.URL.Query().Get("purge"); v != "" && v != "false" {
			perm = PermPurge
		}
	}
	if !slices.Contains(g.Can, perm) {
		return fmt.Sprintf("this token cannot %s (it can %s)", perm, strings.Join(g.Can, ", "))
	}
	if id := r.PathValue("room"); id != "" && !roomMatches(g.Rooms, id) {
		return "this token does not reach room " + id
	}
	return ""
}

// tokenBody is POST /v1/tokens.
type tokenBody struct {
	Rooms     []string `json:"rooms"`
	Can       []string `json:"can"`
	ExpiresIn string   `json:"expires_in"`
	Label     string   `json:"label"`
}

type tokenView struct {
	ID      string     `json:"id"`
	Label   string     `json:"label"`
	Rooms   []string   `json:"rooms"`
	Can     []string   `json:"can"`
	Created time.Time  `json:"created"`
	Expires time.Time  `json:"expires"`
	Revoked *time.Time `json:"revoked,omitempty"`
	// Token is the secret, answered once, at creation.
	Token string `json:"token,omitempty"`
}

func viewToken(t store.Token) tokenView {
	return tokenView{ID: t.ID, Label: t.Label, Rooms: nonNil(t.Rooms), Can: nonNil(t.Can), Created: t.Created.UTC(),
		Expires: t.Expires.UTC(), Revoked: timePtr(t.Revoked.UTC())}
}

// errNoTokens answers the token routes of a server without a token store.
const errNoTokens = "room tokens are not enabled on this server (it has no token store)"

// validRoomPattern checks one of a token's rooms: a room id, or a prefix
// of one followed by "*".
func validRoomPattern(p string) error {
	if prefix, ok := strings.CutSuffix(p, "*"); ok {
		if prefix == "" {
			return nil // every room
		}
		if strings.Contains(prefix, "*") {
			return errors.New("only one *, at the end")
		}
		// A prefix is valid when some id starts with it.
		return room.ValidateID(prefix + "x")
	}
	return room.ValidateID(p)
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) {
	if s.opts.Tokens == nil {
		writeError(w, http.StatusNotImplemented, errNoTokens)
		return
	}
	var b tokenBody
	if !s.decode(w, r, &b) {
		return
	}
	if len(b.Rooms) == 0 || len(b.Rooms) > MaxTokenRooms {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("rooms must name 1 to %d room ids or \"prefix*\" patterns", MaxTokenRooms))
		return
	}
	for _, p := range b.Rooms {
		if err := validRoomPattern(p); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("rooms: %q is neither a room id nor a \"prefix*\" pattern: %s", p, trimPrefix(err)))
			return
		}
	}
	if len(b.Can) == 0 {
		writeError(w, http.StatusBadRequest, "can must name at least one of "+strings.Join(Perms, ", "))
		return
	}
	for _, c := range b.Can {
		if !slices.Contains(Perms, c) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("can: %q is not one of %s", c, strings.Join(Perms, ", ")))
			return
		}
	}
	life := DefaultTokenExpiry
	if b.ExpiresIn != "" {
		d, err := time.ParseDuration(b.ExpiresIn)
		if err != nil || d < MinTokenExpiry || d > MaxTokenExpiry {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("expires_in must be a duration from %s to %s (like \"24h\")", MinTokenExpiry, MaxTokenExpiry))
			return
		}
		life = d
	}
	if utf8.RuneCountInString(b.Label) > maxTokenLabel || strings.ContainsFunc(b.Label, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("label must be at most %d characters, with no control characters", maxTokenLabel))
		return
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		s.fail(w, r, err, "token")
		return
	}
	secret := tokenPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	var idb [8]byte
	if _, err := rand.Read(idb[:]); err != nil {
		s.fail(w, r, err, "token")
		return
	}
	sum := sha256.Sum256([]byte(secret))
	now := time.Now()
	rooms, can := slices.Clone(b.Rooms), slices.Clone(b.Can)
	slices.Sort(can)
	can = slices.Compact(can)
	t := store.Token{ID: "tok_" + hex.EncodeToString(idb[:]), Label: b.Label, Hash: sum[:], Rooms: rooms, Can: can,
		Created: now, Expires: now.Add(life)}
	// Stored first: a token answered is a token that survives a restart.
	// The maps' lock is not held meanwhile (a cluster's store may take
	// seconds in an election: requests go on); the feed may bring the
	// token first.
	s.tokens.writeMu.Lock()
	defer s.tokens.writeMu.Unlock()
	if err := s.opts.Tokens.CreateToken(r.Context(), t); err != nil {
		s.fail(w, r, err, "token")
		return
	}
	s.tokens.mu.Lock()
	if s.tokens.byID[t.ID] == nil {
		s.tokens.add(t)
	}
	s.tokens.mu.Unlock()
	v := viewToken(t)
	v.Token = secret
	writeJSON(w, http.StatusCreated, v)
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) {
	if s.opts.Tokens == nil {
		writeError(w, http.StatusNotImplemented, errNoTokens)
		return
	}
	s.tokens.mu.Lock()
	out := make([]tokenView, 0, len(s.tokens.byID))
	for _, g := range s.tokens.byID {
		out = append(out, g.view())
	}
	s.tokens.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	writeJSON(w, http.StatusOK, map[string]any{"tokens": out})
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) {
	if s.opts.Tokens == nil {
		writeError(w, http.StatusNotImplemented, errNoTokens)
		return
	}
	id := r.PathValue("id")
	// One write at a time; the maps' lock only to look (see createToken).
	s.tokens.writeMu.Lock()
	defer s.tokens.writeMu.Unlock()
	s.tokens.mu.Lock()
	g := s.tokens.byID[id]
	s.tokens.mu.Unlock()
	_, shared := s.opts.Tokens.(TokenFeed)
	if g == nil && !shared {
		writeError(w, http.StatusNotFound, "token "+id+": not found")
		return
	}
	// A shared store is asked even for a token this server has not seen
	// yet: one created through another node a moment ago is revoked, not
	// 404 (its creation and revocation reach this server by the feed).
	if g == nil || g.revokedAt().IsZero() {
		now := time.Now()
		err := s.opts.Tokens.RevokeToken(r.Context(), id, now)
		if g == nil && errors.Is(err, store.ErrNotFound) {
			writeError(w, http.StatusNotFound, "token "+id+": not found")
			return
		}
		if err != nil {
			s.fail(w, r, err, "token "+id)
			return
		}
		if g != nil {
			// The store's time may be another node's, revoked first:
			// the feed corrects it (revokedBy).
			g.revoke(now)
		}
	}
	if g != nil {
		// Ends the token's open requests (its event streams) now.
		g.cancel()
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "revoked": true})
}

// roomsOf answers a page of the rooms a room token reaches with read, in
// order of id: the rooms list of such a token.
func (s *Server) roomsOf(ctx context.Context, g *grant, after string, limit int) (room.RoomsPage, error) {
	ids, err := s.m.Rooms(ctx)
	if err != nil {
		return room.RoomsPage{}, err
	}
	var mine []string
	for _, id := range ids {
		if g.allows(id, PermRead) {
			mine = append(mine, id)
		}
	}
	slices.Sort(mine)
	page := room.RoomsPage{Total: len(mine)}
	i, _ := slices.BinarySearch(mine, after)
	if after != "" && i < len(mine) && mine[i] == after {
		i++
	}
	for ; i < len(mine); i++ {
		if len(page.Rooms) == limit {
			page.More = true
			break
		}
		st, err := s.m.State(ctx, mine[i])
		if errors.Is(err, room.ErrNotFound) {
			page.Total-- // purged since
			continue
		}
		if err != nil {
			return room.RoomsPage{}, err
		}
		page.Rooms = append(page.Rooms, st)
	}
	return page, nil
}

// actor names who made request r, for the server's log: the room token's
// id and label (never its secret), or the admin.
func actor(r *http.Request) []any {
	if g := who(r); g != nil {
		return []any{"token", g.ID, "token_label", g.Label}
	}
	return []any{"token", "admin"}
}

// settingsFields are the names of the fields a settings object sets, in
// order (its values stay out of the log).
func settingsFields(raw json.RawMessage) []string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	names := make([]string, 0, len(m))
	for k := range m {
		if k != "next_start" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	return names
}

// whoami answers the caller's own scope: {"admin": true}, or a room
// token's rooms and permissions (the page hides what it cannot use).
func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	g := who(r)
	if g == nil {
		writeJSON(w, http.StatusOK, map[string]any{"admin": true})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"admin": false, "id": g.ID, "label": g.Label, "rooms": nonNil(g.Rooms),
		"can": nonNil(g.Can), "expires": g.Expires.UTC()})
}
