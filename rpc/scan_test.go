package rpc

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestScanFrame(t *testing.T) {
	tests := []struct {
		in      string
		typ, id string
		hasID   bool
		ok      bool
	}{
		{`{"type":"agent_start"}`, "agent_start", "", false, true},
		{` {"id":"7","type":"response","data":{"type":"nested","id":"no"}} `, "response", "7", true, true},
		{`{"data":[1,2.5e3,-0,true,false,null,{"a":[]}],"type":"x"}`, "x", "", false, true},
		{`{"type":"a\"b"}`, `a"b`, "", false, true},
		{`{"type":"\u0061"}`, "a", "", false, true},
		// A numeric id is kept as its literal text (RequestLine keys by it).
		{`{"id":5,"type":"t"}`, "t", "5", true, true},
		// A duplicated "type" or "id" is refused: readers would disagree.
		{`{"type":"message_update","id":"1","type":"response"}`, "", "", false, false},
		{`{"id":"1","type":"response","id":"2"}`, "", "", false, false},
		{`{"id":"1","type":"response","data":{"id":"2","type":"x"}}`, "response", "1", true, true},
		// Keys are matched as encoding/json matches them: unescaped and
		// case folded. A variant alone is the key; beside it, a duplicate.
		{`{"ID":"1","Type":"response"}`, "response", "1", true, true},
		{`{"\u0069d":"1","t\u0079pe":"response"}`, "response", "1", true, true},
		{`{"type":"response","id":"1","ID":"2"}`, "", "", false, false},
		{`{"type":"response","id":"1","Id":"2"}`, "", "", false, false},
		{`{"type":"response","id":"1","\u0069d":"2"}`, "", "", false, false},
		{`{"type":"response","id":"1","\u0049D":"2"}`, "", "", false, false},
		{`{"type":"response","TYPE":"message_update"}`, "", "", false, false},
		{`{"type":"response","t\u0079pe":"message_update"}`, "", "", false, false},
		{`{"type":"response","ids":"1","typed":"x","i":"y"}`, "response", "", false, true},
		{`{}`, "", "", false, true},
		{`[]`, "", "", false, false},
		{`{"type":"x"`, "", "", false, false},
		{`{"type":"x"}}`, "", "", false, false},
		{`{"type":"x",}`, "", "", false, false},
		{`{"type":"bad\escape"}`, "", "", false, false},
		{"{\"type\":\"ctl\x01\"}", "", "", false, false},
		{`{"n":01}`, "", "", false, false},
		{`{"n":1.}`, "", "", false, false},
		{`{"n":tru}`, "", "", false, false},
		{`not json`, "", "", false, false},
		{``, "", "", false, false},
	}
	for _, tt := range tests {
		h, err := scanFrame([]byte(tt.in))
		if (err == nil) != tt.ok {
			t.Errorf("%q: err = %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if !tt.ok {
			continue
		}
		if got := headString(h.typ, h.typEsc); got != tt.typ {
			t.Errorf("%q: type = %q, want %q", tt.in, got, tt.typ)
		}
		if got := headString(h.id, h.idEsc); got != tt.id || h.hasID != tt.hasID {
			t.Errorf("%q: id = %q (%v), want %q", tt.in, got, h.hasID, tt.id)
		}
	}
}

func TestScanFrame_DeepNesting(t *testing.T) {
	deep := make([]byte, 0, 2*maxJSONDepth+20)
	deep = append(deep, `{"a":`...)
	for i := 0; i < maxJSONDepth+5; i++ {
		deep = append(deep, '[')
	}
	if _, err := scanFrame(deep); err == nil {
		t.Fatal("deeply nested frame accepted")
	}
}

// FuzzScanFrame: scanFrame accepts exactly what encoding/json accepts as an
// object, and finds the same top-level "type".
func FuzzScanFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"message_update","message":{"role":"assistant","content":[{"type":"text","text":"hi \u00e9 \n"}]}}`,
		`{"id":"1","type":"response","command":"get_state","success":true,"data":{"n":-1.5e-3}}`,
		`{"type":"ready","protocolVersion":1,"supportedProtocolVersions":[1,2]}`,
		`{"type":"x\u2028"}`, `[1]`, `{"a":"\ud800"}`, `{"type":1}`, "{\"type\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := scanFrame(b)
		var m map[string]json.RawMessage
		jerr := json.Unmarshal(b, &m)
		valid := json.Valid(b)
		isObj := jerr == nil && m != nil
		var dk *DuplicateKeyError
		if errors.As(err, &dk) {
			// encoding/json takes the last of duplicated keys; scanFrame
			// refuses such a frame instead.
			if !valid || !isObj {
				t.Fatalf("duplicate key reported for a frame encoding/json rejects: %q", b)
			}
			return
		}
		if (err == nil) != (valid && isObj) {
			t.Fatalf("scanFrame err=%v, json valid=%v object=%v for %q", err, valid, isObj, b)
		}
		if err != nil {
			return
		}
		var want struct {
			Type any `json:"type"`
		}
		_ = json.Unmarshal(b, &want)
		// The scanner matches keys as the decoder does (unescaped, case
		// folded), so both find the same "type".
		if s, ok := want.Type.(string); ok {
			if got := headString(h.typ, h.typEsc); got != s && validUTF8String(s) {
				t.Fatalf("type = %q, want %q in %q", got, s, b)
			}
		}
	})
}

func validUTF8String(s string) bool {
	for _, r := range s {
		if r == '\uFFFD' {
			return false
		}
	}
	return true
}
