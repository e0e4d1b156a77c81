package event

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/record"
)

// TestTypes: every type is listed once, decodes as itself, and has its
// fields in the order of their JSON names (the order the log has always
// written them in: they were maps once).
func TestTypes(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Types() {
		typ := p.EventType()
		if seen[typ] {
			t.Errorf("%s listed twice", typ)
		}
		seen[typ] = true
		if got := reflect.TypeOf(newPayload(typ)); got != reflect.PointerTo(reflect.TypeOf(p)) {
			t.Errorf("%s: newPayload gives %v, Types %T", typ, got, p)
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		back, err := Decode(typ, b)
		if err != nil || reflect.TypeOf(back) != reflect.TypeOf(p) {
			t.Errorf("%s: decoded as %T, %v", typ, back, err)
		}
		rt := reflect.TypeOf(p)
		var names []string
		for i := range rt.NumField() {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			if name == "" || name == "-" {
				t.Errorf("%s.%s has no JSON name", rt.Name(), rt.Field(i).Name)
			}
			names = append(names, name)
		}
		if !slices.IsSorted(names) {
			t.Errorf("%s: fields %v are not in the order of their names", rt.Name(), names)
		}
	}
	if len(seen) != 26 {
		t.Errorf("%d types, want 26 (a new type goes in Types and newPayload)", len(seen))
	}
	if _, err := Decode("no.such", []byte(`{}`)); !errors.Is(err, ErrUnknownType) {
		t.Errorf("unknown type: %v", err)
	}
	if _, err := Decode(TypeTurnEnded, []byte(`{"usage": 3}`)); err == nil || errors.Is(err, ErrUnknownType) {
		t.Errorf("bad fields: %v", err)
	}
}

// TestTurnEndedChanges: changes is absent without snapshots, null when a
// snapshot failed, and the counts otherwise.
func TestTurnEndedChanges(t *testing.T) {
	for _, c := range []struct {
		e    TurnEnded
		want string
	}{
		{TurnEnded{TurnID: "t"}, `{"message_id":"","outcome":"","reason":"","text":"","turn_id":"t","usage":{"input_tokens":0,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0,"cost_usd":0}}`},
		{TurnEnded{TurnID: "t", ChangesError: "no snapshot"}, `{"changes":null,"changes_error":"no snapshot","message_id":"","outcome":"","reason":"","text":"","turn_id":"t","usage":{"input_tokens":0,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0,"cost_usd":0}}`},
		{TurnEnded{TurnID: "t", Changes: &Changes{Files: 1, Insertions: 2}}, `{"changes":{"files":1,"insertions":2,"deletions":0},"message_id":"","outcome":"","reason":"","text":"","turn_id":"t","usage":{"input_tokens":0,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0,"cost_usd":0}}`},
	} {
		b, err := json.Marshal(c.e)
		if err != nil || string(b) != c.want {
			t.Errorf("got %s %v\nwant %s", b, err, c.want)
		}
		var back TurnEnded
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, c.e) {
			t.Errorf("read back %+v %v", back, err)
		}
	}
}

// TestDecodeFlatEvent: a whole event, as the stream carries it, decodes
// as its payload (the envelope's fields are not the payload's).
func TestDecodeFlatEvent(t *testing.T) {
	ev := record.Event{Room: "r", Seq: 7, Type: TypeMessageEnded, Time: time.Unix(1, 0)}
	ev.Data, _ = json.Marshal(MessageEnded{MessageID: "m", Outcome: "failed", Reason: "why"})
	flat, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Decode(ev.Type, flat)
	if err != nil || p != (MessageEnded{MessageID: "m", Outcome: "failed", Reason: "why"}) {
		t.Fatalf("%+v %v", p, err)
	}
}

func TestConfinementJSON(t *testing.T) {
	for _, c := range []Confinement{{Mode: "landlock", ABI: 6, Signals: true}, {Mode: "landlock", ABI: 6, Net: []uint16{443}}} {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var back Confinement
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, c) {
			t.Errorf("%s read back as %+v %v", b, back, err)
		}
	}
}
