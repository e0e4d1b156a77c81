package main

import (
	"context"
	"testing"

	"github.com/agenthost/agenthost/client"
)

// testClient waits on a room's events through the client package, with a
// callback that says when to stop.
type testClient struct{ c *client.Client }

func newTestClient(t testing.TB, url, token string) *testClient {
	t.Helper()
	c, err := client.New(url, client.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return &testClient{c}
}

// events calls fn with each event's type and JSON after after (following
// new ones when follow) until fn returns true or an error.
func (tc *testClient) events(ctx context.Context, room string, after int64, follow bool, fn func(typ string, raw []byte) (bool, error)) error {
	evs := tc.c.Events
	if follow {
		evs = tc.c.Follow
	}
	for ev, err := range evs(ctx, room, after) {
		if err != nil {
			return err
		}
		if stop, err := fn(ev.Type, ev.Data); stop || err != nil {
			return err
		}
	}
	return nil
}

// exitCode is the exit code main gives err.
func exitCode(err error) int {
	code, _ := exitStatus(context.Background(), err)
	return code
}
