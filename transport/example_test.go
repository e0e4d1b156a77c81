package transport_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/modeltest"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/sqlitestore"
	"github.com/agenthost/agenthost/transport"
)

// A room on pi, confined where the kernel has Landlock: the agent's bash
// call waits for a person's approval (pi asks through agenthost's
// extension), which the program gives.
func ExampleNewRPC() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := must(os.MkdirTemp("", "transport"))
	defer os.RemoveAll(dir)
	model := must(modeltest.Start(ctx, modeltest.Options{}))
	defer model.Close()
	st := must(sqlitestore.Open(ctx, filepath.Join(dir, "agenthost.db"), sqlitestore.Options{}))
	defer st.Close()
	cust := must(custody.New(custody.Options{}))
	defer cust.Close()

	pi := must(transport.NewRPC(transport.Options{Custodian: cust, ModelURL: model.URL(),
		Confinement: transport.Confinement{Mode: transport.ConfineAuto}}))
	m := must(room.New(room.Options{Store: st, Transport: pi, Root: filepath.Join(dir, "rooms"),
		Config: room.Config{Agent: "pi", ApprovalMode: room.ApprovalAsk}}))
	check(m.Start(ctx))
	defer func() {
		check(m.Close())
		check(m.Wait(ctx))
	}()

	acc := must(m.Submit(ctx, "ticket-1", room.Message{Text: `[[tool:bash {"command":"echo hi > hello.txt"}]]`}))
	ev := next(ctx, m, "ticket-1", acc.Seq, event.TypeApprovalRequested)
	var ask event.ApprovalRequested
	check(json.Unmarshal(ev.Data, &ask))
	fmt.Println("pi asks to run:", ask.Tool)
	check(m.Approve(ctx, "ticket-1", ask.ApprovalID, true))

	ev = next(ctx, m, "ticket-1", ev.Seq, event.TypeTurnEnded)
	var end event.TurnEnded
	check(json.Unmarshal(ev.Data, &end))
	fmt.Println(end.Outcome, end.Text)
	// Output:
	// pi asks to run: bash
	// settled done
}

// A room on omp over the Agent Client Protocol (omp acp).
func ExampleNewACP() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := must(os.MkdirTemp("", "transport"))
	defer os.RemoveAll(dir)
	model := must(modeltest.Start(ctx, modeltest.Options{}))
	defer model.Close()
	st := must(sqlitestore.Open(ctx, filepath.Join(dir, "agenthost.db"), sqlitestore.Options{}))
	defer st.Close()
	cust := must(custody.New(custody.Options{}))
	defer cust.Close()

	acp := must(transport.NewACP(transport.Options{Custodian: cust, ModelURL: model.URL()}))
	m := must(room.New(room.Options{Store: st, Transport: acp, Root: filepath.Join(dir, "rooms")}))
	check(m.Start(ctx))
	defer func() {
		check(m.Close())
		check(m.Wait(ctx))
	}()

	acc := must(m.Submit(ctx, "general", room.Message{Text: "hello"}))
	var end event.TurnEnded
	check(json.Unmarshal(next(ctx, m, "general", acc.Seq, event.TypeTurnEnded).Data, &end))
	fmt.Println(end.Outcome, end.Text)
	// Output: settled ok: hello
}

// next waits for the room's first event of type typ after seq.
func next(ctx context.Context, m *room.Manager, roomID string, seq int64, typ string) record.Event {
	watch, stop := m.Watch(roomID)
	defer stop()
	for {
		for _, ev := range must(m.Events(ctx, roomID, seq, 0)) {
			if seq = ev.Seq; ev.Type == typ {
				return ev
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			log.Fatalf("no %s event: %v", typ, ctx.Err())
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
