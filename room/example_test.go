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
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// A program hosting rooms on omp, answered by the built-in scripted
// model: open the store, take custody of the agents, start the rooms,
// submit a message and print the agent's answer.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := must(os.MkdirTemp("", "rooms"))
	defer os.RemoveAll(dir)
	sim := modelsim.New(modelsim.Options{})
	check(sim.Start(ctx))
	defer sim.Close()

	db := must(store.Open(ctx, filepath.Join(dir, "agenthost.db"), store.Options{}))
	defer db.Close()
	cust := must(custody.New(custody.Options{}))
	defer cust.Close()
	omp := must(rpcagent.New(rpcagent.Options{Custodian: cust, Install: must(agents.Find()), ModelURL: sim.URL()}))
	m := must(room.New(room.Options{Store: roomsqlite.New(db), Transport: omp, Root: filepath.Join(dir, "rooms")}))
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
