//go:build linux

package procd

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"testing"
)

// FuzzEnvelope feeds frames to the daemon's framing, envelope check and
// every op's strict decoding: an error or a request, never a panic.
func FuzzEnvelope(f *testing.F) {
	const tok = "0123456789abcdef0123456789abcdef"
	for _, seed := range []string{
		`{"token":"` + tok + `","request":{"op":"ping"}}`,
		`{"token":"` + tok + `","request":{"op":"create_pipe","argv":["sh"],"cwd":"/","env":["A=1"],"output_path":"/tmp/x","metadata":{"a":1}}}`,
		`{"token":"` + tok + `","request":{"op":"write","id":"p-1","data":"aGkK","eof":true}}`,
		`{"token":"` + tok + `","request":{"op":"subscribe","id":"t-1","offset":-1,"control":true}}`,
		`{"token":"` + tok + `","request":{"op":"own","instance_id":"x","ticket":"y"}}`,
		`{"token":"","request":{}}`,
		`{"request":"x"}`,
		`[]`,
	} {
		var h [4]byte
		binary.BigEndian.PutUint32(h[:], uint32(len(seed)))
		f.Add(append(h[:], seed...))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		b, err := readFrame(bytes.NewReader(frame))
		if err != nil {
			return
		}
		op, raw, err := parseEnvelope(b, tok)
		if err != nil {
			var re *reqErr
			if !errors.As(err, &re) {
				t.Fatalf("an envelope error that is no reply: %v", err)
			}
			return
		}
		if op == "" || !json.Valid(raw) {
			t.Fatalf("op %q raw %q", op, raw)
		}
		// Every op's request shape decodes strictly or says why.
		for _, v := range []any{&PipeSpec{}, &PTYSpec{}, &struct {
			Op     string `json:"op"`
			ID     string `json:"id"`
			Data   []byte `json:"data"`
			Offset int64  `json:"offset"`
		}{}} {
			if err := decode(op, raw, v); err != nil {
				var re *reqErr
				if !errors.As(err, &re) || re.code != codeInvalid {
					t.Fatalf("decode error %v", err)
				}
			}
		}
	})
}

// FuzzReadFrame: any byte stream yields frames within the cap or an error.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Add([]byte{0x00, 0x80, 0x00, 0x01})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			b, err := readFrame(r)
			if err != nil {
				return
			}
			if len(b) > MaxFrame {
				t.Fatalf("a frame of %d bytes", len(b))
			}
		}
	})
}
