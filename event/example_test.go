package event_test

import (
	"errors"
	"fmt"

	"github.com/agenthost/agenthost/event"
)

// A program reading a room's log switches on the payload's Go type, and
// skips types it does not know.
func ExampleDecode() {
	lines := []struct{ typ, data string }{
		{"turn.started", `{"seq":3,"type":"turn.started","room":"r","time":"2026-01-02T03:04:05Z","message_id":"m_1","turn_id":"t_1"}`},
		{"text.delta", `{"seq":4,"type":"text.delta","room":"r","time":"2026-01-02T03:04:05Z","text":"hello","turn_id":"t_1"}`},
		{"some.future.type", `{"seq":5}`},
		{"message.ended", `{"seq":6,"type":"message.ended","room":"r","time":"2026-01-02T03:04:06Z","message_id":"m_1","outcome":"settled","turn_id":"t_1"}`},
	}
	for _, l := range lines {
		p, err := event.Decode(l.typ, []byte(l.data))
		if errors.Is(err, event.ErrUnknownType) {
			continue
		}
		switch p := p.(type) {
		case event.TurnStarted:
			fmt.Println("turn", p.TurnID, "started")
		case event.TextDelta:
			fmt.Println("text:", p.Text)
		case event.MessageEnded:
			fmt.Println("message", p.MessageID, p.Outcome)
		}
	}
	// Output:
	// turn t_1 started
	// text: hello
	// message m_1 settled
}
