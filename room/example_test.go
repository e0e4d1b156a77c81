package room_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/modeltest"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/sqlitestore"
	"github.com/agenthost/agenthost/transport"
)

// A program hosting rooms on omp, answered by the built-in scripted
// model: open the store, take custody of the agents, start the rooms,
// submit a message and print the agent's answer.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := must(os.MkdirTemp("", "rooms"))
	defer os.RemoveAll(dir)
	model := must(modeltest.Start(ctx, modeltest.Options{}))
	defer model.Close()

	st := must(sqlitestore.Open(ctx, filepath.Join(dir, "agenthost.db"), sqlitestore.Options{}))
	defer st.Close()
	cust := must(custody.New(custody.Options{}))
	defer cust.Close()
	omp := must(transport.NewRPC(transport.Options{Custodian: cust, ModelURL: model.URL()}))
	m := must(room.New(room.Options{Store: st, Transport: omp, Root: filepath.Join(dir, "rooms")}))
	check(m.Start(ctx))
	defer func() {
		// Close begins the shutdown; Wait sees the agents released.
		check(m.Close())
		check(m.Wait(ctx))
	}()

	acc := must(m.Submit(ctx, "general", room.Message{Text: "hello", Sender: "ann"}))
	fmt.Println(answer(ctx, m, "general", acc))
	// Output: ok: hello
}

// answer waits for the end of the message's turn and returns the agent's
// final text.
func answer(ctx context.Context, m *room.Manager, roomID string, acc room.Accepted) string {
	watch, stop := m.Watch(roomID)
	defer stop()
	for after := acc.Seq; ; {
		for _, ev := range must(m.Events(ctx, roomID, after, 0)) {
			after = ev.Seq
			var end struct {
				MessageID string `json:"message_id"`
				Outcome   string `json:"outcome"`
				Reason    string `json:"reason"`
				Text      string `json:"text"`
			}
			if ev.Type == "turn.ended" && json.Unmarshal(ev.Data, &end) == nil && end.MessageID == acc.ID {
				if end.Outcome != room.OutcomeSettled {
					return end.Outcome + ": " + end.Reason
				}
				return end.Text
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return "no answer: " + ctx.Err().Error()
		}
	}
}

func must[T any](v T, err error) T {
	check(err)
	return v
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
