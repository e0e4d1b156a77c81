package room

import (
	"context"

	"github.com/agenthost/agenthost/event"
)

type tokenKey struct{}

// WithToken returns ctx naming the room token on whose behalf a call is
// made (the HTTP server's room tokens): the events the call causes
// (message.accepted, approval.resolved, question.answered,
// workspace.reverted, agent.released) record it, and a cluster carries it
// to the room's holder.
func WithToken(ctx context.Context, t event.TokenRef) context.Context {
	return context.WithValue(ctx, tokenKey{}, &t)
}

// tokenOf is the token WithToken gave ctx (nil for none).
func tokenOf(ctx context.Context) *event.TokenRef {
	t, _ := ctx.Value(tokenKey{}).(*event.TokenRef)
	return t
}
