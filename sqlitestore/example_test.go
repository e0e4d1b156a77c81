package sqlitestore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/modeltest"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/sqlitestore"
	"github.com/agenthost/agenthost/transport"
)

// Rooms on omp kept in the store: what a Manager wrote is there when the
// file is opened again (by the next run of the program).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := must(os.MkdirTemp("", "sqlitestore"))
	defer os.RemoveAll(dir)
	model := must(modeltest.Start(ctx, modeltest.Options{}))
	defer model.Close()
	cust := must(custody.New(custody.Options{}))
	defer cust.Close()
	omp := must(transport.NewRPC(transport.Options{Custodian: cust, ModelURL: model.URL()}))
	path := filepath.Join(dir, "agenthost.db")

	st := must(sqlitestore.Open(ctx, path, sqlitestore.Options{}))
	m := must(room.New(room.Options{Store: st, Transport: omp, Root: filepath.Join(dir, "rooms")}))
	check(m.Start(ctx))
	watch, stop := m.Watch("general")
	acc := must(m.Submit(ctx, "general", room.Message{Text: "hello", Sender: "ann"}))
	// Until the message has ended (each commit to the room's log wakes
	// the watch).
	for msgs := []record.Message(nil); len(msgs) == 0 || msgs[0].Status != record.MessageEnded; {
		select {
		case <-watch:
		case <-ctx.Done():
			log.Fatal(ctx.Err())
		}
		msgs = must(st.Messages(ctx, "general", acc.Seq-1, 1))
	}
	stop()
	check(m.Close())
	check(m.Wait(ctx))
	check(st.Close())

	st = must(sqlitestore.Open(ctx, path, sqlitestore.Options{}))
	defer st.Close()
	for _, msg := range must(st.Messages(ctx, "general", 0, 0)) {
		fmt.Println(msg.Sender, msg.Text, msg.Status, msg.Outcome)
	}
	turns := must(st.Turns(ctx, "general", 0, 0))
	fmt.Println(len(turns), "turn:", turns[0].Text)
	// Output:
	// ann hello ended settled
	// 1 turn: ok: hello
}

// One Store holds a file: a second Open fails until the first is closed.
func ExampleOpen_locked() {
	ctx := context.Background()
	dir := must(os.MkdirTemp("", "sqlitestore"))
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "agenthost.db")
	st := must(sqlitestore.Open(ctx, path, sqlitestore.Options{}))
	_, err := sqlitestore.Open(ctx, path, sqlitestore.Options{})
	fmt.Println(errors.Is(err, sqlitestore.ErrLocked))
	check(st.Close())
	st = must(sqlitestore.Open(ctx, path, sqlitestore.Options{}))
	check(st.Close())
	// Output: true
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
