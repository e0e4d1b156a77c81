package httpapi_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/httpapi"
	"github.com/agenthost/agenthost/modeltest"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/sqlitestore"
	"github.com/agenthost/agenthost/transport"
)

// Rooms on omp served under /agents/ on a program's own mux, beside its
// own routes, and used with package client.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := must(os.MkdirTemp("", "httpapi"))
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
		check(m.Close())
		check(m.Wait(ctx))
	}()

	api := must(httpapi.New(httpapi.Options{Manager: m, Token: "secret"}))
	defer api.Close()
	mux := http.NewServeMux()
	mux.Handle("/agents/", http.StripPrefix("/agents", api))
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "the program's own route") })
	srv := httptest.NewServer(mux) // a real program: http.Server{Handler: mux, ReadHeaderTimeout: …}
	defer srv.Close()

	c := must(client.New(srv.URL+"/agents", client.Options{Token: "secret"}))
	acc := must(c.Send(ctx, "general", client.NewMessage{Text: "hello", Sender: "ann"}))
	for ev, err := range c.Follow(ctx, "general", acc.Seq-1) {
		check(err)
		if ev.Type == client.TypeTurnEnded {
			var end client.TurnEnded
			check(ev.Decode(&end))
			fmt.Println(end.Outcome, end.Text)
			break
		}
	}
	// Output: settled ok: hello
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
