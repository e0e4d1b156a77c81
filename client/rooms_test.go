package client_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// TestRoomsPages: Rooms reads every page (more rooms than the largest
// page), in order of id; RoomsPage returns one page with the total and
// the next cursor; a bad cursor is the server's 400.
func TestRoomsPages(t *testing.T) {
	api := newAPI(t, room.Options{})
	const n = client.MaxRoomsPage + 205
	err := api.db.Write(t.Context(), func(w *store.Writer) error {
		for i := range n {
			if _, err := w.Append(fmt.Sprintf("r%05d", i), "x", nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, api.URL(), client.Options{})
	all, err := c.Rooms(t.Context())
	if err != nil || len(all) != n {
		t.Fatalf("rooms: %d, %v; want %d", len(all), err, n)
	}
	for i, r := range all {
		if want := fmt.Sprintf("r%05d", i); r.ID != want || r.LastSeq != 1 {
			t.Fatalf("room %d: %s (last seq %d), want %s", i, r.ID, r.LastSeq, want)
		}
	}
	p, err := c.RoomsPage(t.Context(), "r00010", 2)
	if err != nil || len(p.Rooms) != 2 || p.Rooms[0].ID != "r00011" || p.Next != "r00012" || p.Total != n {
		t.Fatalf("page after r00010: %+v %v", p, err)
	}
	if p, err = c.RoomsPage(t.Context(), fmt.Sprintf("r%05d", n-2), 0); err != nil || len(p.Rooms) != 1 || p.Next != "" {
		t.Fatalf("last page: %+v %v", p, err)
	}
	var ae *client.APIError
	if _, err := c.RoomsPage(t.Context(), " x", 0); !errors.As(err, &ae) || ae.StatusCode != 400 {
		t.Fatalf("bad cursor: %v, want a 400", err)
	}
}
