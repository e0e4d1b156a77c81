// A program outside agenthost's module that hosts a room on pi with the
// public library only: the SQLite store (sqlitestore), the RPC transport
// with pi's extension and confinement (transport), the built-in scripted
// model (modeltest) and the HTTP API mounted on its own mux (httpapi),
// used through package client. It prints what the room did, one line a
// step, for the test to compare.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/httpapi"
	"github.com/agenthost/agenthost/modeltest"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/sqlitestore"
	"github.com/agenthost/agenthost/transport"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "outside:", err)
		os.Exit(1)
	}
}

func run() (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "outside")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	model, err := modeltest.Start(ctx, modeltest.Options{})
	if err != nil {
		return err
	}
	defer model.Close()
	path := filepath.Join(dir, "agenthost.db")
	st, err := sqlitestore.Open(ctx, path, sqlitestore.Options{})
	if err != nil {
		return err
	}
	defer func() {
		if st != nil {
			err = errors.Join(err, st.Close())
		}
	}()
	cust, err := custody.New(custody.Options{})
	if err != nil {
		return err
	}
	defer cust.Close()
	pi, err := transport.NewRPC(transport.Options{Custodian: cust, ModelURL: model.URL()})
	if err != nil {
		return err
	}
	m, err := room.New(room.Options{Store: st, Transport: pi, Root: filepath.Join(dir, "rooms"),
		Config: room.Config{Agent: "pi", ApprovalMode: room.ApprovalAsk}})
	if err != nil {
		return err
	}
	if err := m.Start(ctx); err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			err = errors.Join(err, m.Close(), m.Wait(ctx))
		}
	}()

	// A turn on pi.
	acc, err := m.Submit(ctx, "lobby", room.Message{Text: "hello", Sender: "ann"})
	if err != nil {
		return err
	}
	var end event.TurnEnded
	if err := next(ctx, m, "lobby", acc.Seq, event.TypeTurnEnded, &end); err != nil {
		return err
	}
	fmt.Println(end.Text)
	fmt.Println("ended:", end.Outcome)
	state, err := m.State(ctx, "lobby")
	if err != nil {
		return err
	}
	if state.Confinement == nil {
		return errors.New("the room's state says nothing of its confinement")
	}
	fmt.Println("confined:", state.Confinement.Mode)

	// pi's bash call waits for a person's approval (agenthost's pi
	// extension asks the room).
	acc, err = m.Submit(ctx, "lobby", room.Message{Text: `[[tool:bash {"command":"echo hi"}]]`, Sender: "ann"})
	if err != nil {
		return err
	}
	var ask event.ApprovalRequested
	seq, err := nextSeq(ctx, m, "lobby", acc.Seq, event.TypeApprovalRequested, &ask)
	if err != nil {
		return err
	}
	fmt.Println("asks:", ask.Tool)
	if err := m.Approve(ctx, "lobby", ask.ApprovalID, true); err != nil {
		return err
	}
	var tool event.ToolEnded
	if seq, err = nextSeq(ctx, m, "lobby", seq, event.TypeToolEnded, &tool); err != nil {
		return err
	}
	fmt.Printf("tool: %q\n", tool.Output)
	if err := next(ctx, m, "lobby", seq, event.TypeTurnEnded, &end); err != nil {
		return err
	}
	fmt.Println("approved:", end.Outcome, end.Text)

	// pi's ask tool (the extension's) becomes the room's question.
	acc, err = m.Submit(ctx, "lobby", room.Message{Sender: "ann",
		Text: `[[tool:ask {"questions":[{"id":"c","question":"Which color?","options":[{"label":"red"},{"label":"blue"}]}]}]]`})
	if err != nil {
		return err
	}
	var q event.QuestionAsked
	if seq, err = nextSeq(ctx, m, "lobby", acc.Seq, event.TypeQuestionAsked, &q); err != nil {
		return err
	}
	fmt.Println("question:", q.Title, q.Options)
	if err := m.Answer(ctx, "lobby", q.QuestionID, "blue"); err != nil {
		return err
	}
	if seq, err = nextSeq(ctx, m, "lobby", seq, event.TypeToolEnded, &tool); err != nil {
		return err
	}
	fmt.Println("the agent got blue:", strings.Contains(tool.Output, "blue"))
	if err := next(ctx, m, "lobby", seq, event.TypeTurnEnded, &end); err != nil {
		return err
	}
	fmt.Println("answered:", end.Outcome, end.Text)

	// The same room through the HTTP API, on this program's own server.
	api, err := httpapi.New(httpapi.Options{Manager: m, Token: "outside-token"})
	if err != nil {
		return err
	}
	defer api.Close()
	mux := http.NewServeMux()
	mux.Handle("/rooms-api/", http.StripPrefix("/rooms-api", api))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	c, err := client.New("http://"+ln.Addr().String()+"/rooms-api", client.Options{Token: "outside-token"})
	if err != nil {
		return err
	}
	cacc, err := c.Send(ctx, "lobby", client.NewMessage{Text: "again", Sender: "bob"})
	if err != nil {
		return err
	}
	ended, err := c.Wait(ctx, "lobby", cacc)
	if err != nil {
		return err
	}
	fmt.Println("api:", ended.Outcome)
	wrong, err := client.New("http://"+ln.Addr().String()+"/rooms-api", client.Options{Token: "wrong"})
	if err != nil {
		return err
	}
	_, err = wrong.Room(ctx, "lobby")
	fmt.Println("wrong token refused:", errors.Is(err, client.ErrUnauthorized))

	// Everything is in the store when it is opened again.
	api.Close()
	_ = srv.Close()
	closed = true
	if err := errors.Join(m.Close(), m.Wait(ctx), st.Close()); err != nil {
		return err
	}
	st = nil
	again, err := sqlitestore.Open(ctx, path, sqlitestore.Options{})
	if err != nil {
		return err
	}
	defer again.Close()
	msgs, err := again.Messages(ctx, "lobby", 0, 0)
	if err != nil {
		return err
	}
	for _, msg := range msgs {
		fmt.Println("stored:", msg.Sender, msg.Status, msg.Outcome)
	}
	evs, err := again.Events(ctx, "lobby", 0, 0)
	fmt.Println("released:", hasType(evs, event.TypeAgentReleased), err)
	return nil
}

// next decodes into v the room's first event of type typ after seq.
func next(ctx context.Context, m *room.Manager, roomID string, seq int64, typ string, v any) error {
	_, err := nextSeq(ctx, m, roomID, seq, typ, v)
	return err
}

// nextSeq is next, and returns the event's sequence number.
func nextSeq(ctx context.Context, m *room.Manager, roomID string, seq int64, typ string, v any) (int64, error) {
	watch, stop := m.Watch(roomID)
	defer stop()
	for {
		evs, err := m.Events(ctx, roomID, seq, 0)
		if err != nil {
			return 0, err
		}
		for _, ev := range evs {
			if seq = ev.Seq; ev.Type == typ {
				return seq, json.Unmarshal(ev.Data, v)
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for %s: %w", typ, ctx.Err())
		}
	}
}

func hasType(evs []record.Event, typ string) bool {
	for _, ev := range evs {
		if ev.Type == typ {
			return true
		}
	}
	return false
}
