package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/room"
	"go.uber.org/goleak"
)

// The examples talk to a server the test starts: agenthost's HTTP API
// over rooms whose agents are fakes (an agent answers "ok: <text>",
// "approve:TOOL" asks an approval, "ask:TITLE" a question).
var serverURL, token string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agenthost-client-example-")
	if err != nil {
		log.Fatal(err)
	}
	api, err := startAPI(context.Background(), dir, room.Options{})
	if err != nil {
		log.Fatal(err)
	}
	serverURL, token = api.URL(), testToken
	code := m.Run()
	api.stop()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Send a message, then follow the room's events until its turn ends.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(serverURL, client.Options{Token: token})
	if err != nil {
		log.Fatal(err)
	}
	acc, err := c.Send(ctx, "example", client.NewMessage{Text: "hello", Sender: "ann"})
	if err != nil {
		log.Fatal(err)
	}
	for ev, err := range c.Follow(ctx, "example", acc.Seq-1) {
		if err != nil {
			log.Fatal(err)
		}
		if ev.Type == client.TypeTurnEnded {
			var te client.TurnEnded
			if err := ev.Decode(&te); err != nil {
				log.Fatal(err)
			}
			fmt.Printf("%s: %s\n", te.Outcome, te.Text)
			break
		}
	}
	// Output: settled: ok: hello
}

// Wait returns how a message ended, whatever consumed it.
func ExampleClient_Wait() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(serverURL, client.Options{Token: token})
	if err != nil {
		log.Fatal(err)
	}
	acc, err := c.Send(ctx, "example-wait", client.NewMessage{Text: "hello"})
	if err != nil {
		log.Fatal(err)
	}
	end, err := c.Wait(ctx, "example-wait", acc)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(end.Outcome)
	// Output: settled
}

// An agent asks before running a tool: decide it with Approve.
func ExampleClient_Approve() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(serverURL, client.Options{Token: token})
	if err != nil {
		log.Fatal(err)
	}
	acc, err := c.Send(ctx, "example-approve", client.NewMessage{Text: "approve:bash"})
	if err != nil {
		log.Fatal(err)
	}
	for ev, err := range c.Follow(ctx, "example-approve", acc.Seq-1) {
		if err != nil {
			log.Fatal(err)
		}
		switch ev.Type {
		case client.TypeApprovalRequested:
			var ar client.ApprovalRequested
			if err := ev.Decode(&ar); err != nil {
				log.Fatal(err)
			}
			d, err := c.Approve(ctx, "example-approve", ar.ApprovalID, true)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Printf("%s: %s\n", ar.Tool, d.Decision)
		case client.TypeTurnEnded:
			var te client.TurnEnded
			if err := ev.Decode(&te); err != nil {
				log.Fatal(err)
			}
			fmt.Println(te.Text)
			return
		}
	}
	// Output:
	// bash: allow
	// allowed
}

// An agent asks a question: answer it with Answer.
func ExampleClient_Answer() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(serverURL, client.Options{Token: token})
	if err != nil {
		log.Fatal(err)
	}
	acc, err := c.Send(ctx, "example-answer", client.NewMessage{Text: "ask:Which color?"})
	if err != nil {
		log.Fatal(err)
	}
	for ev, err := range c.Follow(ctx, "example-answer", acc.Seq-1) {
		if err != nil {
			log.Fatal(err)
		}
		switch ev.Type {
		case client.TypeQuestionAsked:
			var q client.QuestionAsked
			if err := ev.Decode(&q); err != nil {
				log.Fatal(err)
			}
			fmt.Println(q.Title, q.Options)
			if _, err := c.Answer(ctx, "example-answer", q.QuestionID, "blue"); err != nil {
				log.Fatal(err)
			}
		case client.TypeTurnEnded:
			var te client.TurnEnded
			if err := ev.Decode(&te); err != nil {
				log.Fatal(err)
			}
			fmt.Println(te.Text)
			return
		}
	}
	// Output:
	// Which color? [red blue]
	// answer: blue
}

// Errors match the sentinels with errors.Is.
func ExampleAPIError() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(serverURL, client.Options{Token: token})
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Room(ctx, "no-such-room")
	fmt.Println(errors.Is(err, client.ErrNotFound), err)

	wrong, err := client.New(serverURL, client.Options{Token: "wrong"})
	if err != nil {
		log.Fatal(err)
	}
	_, err = wrong.Rooms(ctx)
	fmt.Println(errors.Is(err, client.ErrUnauthorized))
	// Output:
	// true room no-such-room: not found (HTTP 404)
	// true
}
