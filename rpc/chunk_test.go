package rpc

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"
)

// chunkLines splits a frame the way omp does (256 KiB of bytes per chunk).
func chunkLines(frame []byte, id string) [][]byte {
	count := (len(frame) + chunkPayloadMax - 1) / chunkPayloadMax
	var out [][]byte
	for i := 0; i < count; i++ {
		part := frame[i*chunkPayloadMax : min((i+1)*chunkPayloadMax, len(frame))]
		line, _ := json.Marshal(map[string]any{
			"type": "rpc_chunk", "chunkId": id, "index": i, "count": count,
			"byteLength": len(frame), "data": base64.StdEncoding.EncodeToString(part),
		})
		out = append(out, line)
	}
	return out
}

func bigFrame(n int) []byte {
	text := strings.Repeat("é–x", n/6)
	b, _ := json.Marshal(map[string]any{"type": "message_end", "message": map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": text}}}})
	return b
}

func TestReassembler_RoundTrip(t *testing.T) {
	frame := bigFrame(3 << 20)
	r := newReassembler()
	lines := chunkLines(frame, "c1")
	for i, l := range lines {
		out, err := r.push(l)
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if i < len(lines)-1 && out != nil {
			t.Fatalf("chunk %d: early output", i)
		}
		if i == len(lines)-1 && !bytes.Equal(out, frame) {
			t.Fatalf("reassembled frame differs (%d vs %d bytes)", len(out), len(frame))
		}
	}
	if r.pending() {
		t.Fatal("still pending after the last chunk")
	}
}

func TestReassembler_Rejects(t *testing.T) {
	frame := bigFrame(2 << 20)
	good := chunkLines(frame, "c1")
	mutate := func(i int, f func(m map[string]any)) [][]byte {
		out := append([][]byte(nil), good...)
		var m map[string]any
		_ = json.Unmarshal(good[i], &m)
		f(m)
		out[i], _ = json.Marshal(m)
		return out
	}
	cases := map[string][][]byte{
		"out of order":      {good[1], good[0]},
		"skipped index":     {good[0], good[2]},
		"other id":          mutate(1, func(m map[string]any) { m["chunkId"] = "c2" }),
		"other count":       mutate(1, func(m map[string]any) { m["count"] = 99 }),
		"other length":      mutate(1, func(m map[string]any) { m["byteLength"] = 3 << 20 }),
		"padding bits":      mutate(0, func(m map[string]any) { m["data"] = "QR==" }),
		"whitespace base64": mutate(0, func(m map[string]any) { m["data"] = "QUJD\nQUJD" }),
		"empty data":        mutate(0, func(m map[string]any) { m["data"] = "" }),
		"fraction index":    mutate(0, func(m map[string]any) { m["index"] = 0.5 }),
		"count one":         mutate(0, func(m map[string]any) { m["count"] = 1 }),
		"too small length":  mutate(0, func(m map[string]any) { m["byteLength"] = 100 }),
		"missing data":      mutate(0, func(m map[string]any) { delete(m, "data") }),
		"short":             mutate(len(good)-1, func(m map[string]any) { m["data"] = "QUJD" }),
	}
	for name, seq := range cases {
		t.Run(name, func(t *testing.T) {
			r := newReassembler()
			var err error
			for _, l := range seq {
				if _, err = r.push(l); err != nil {
					break
				}
			}
			if err == nil {
				t.Fatal("sequence accepted")
			}
			if r.pending() {
				t.Fatal("a failed sequence stays pending")
			}
		})
	}
	// Invalid UTF-8 in the payload.
	bad := append([]byte(nil), frame...)
	bad[100] = 0xff
	r := newReassembler()
	var err error
	for _, l := range chunkLines(bad, "c9") {
		if _, err = r.push(l); err != nil {
			break
		}
	}
	if err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("invalid UTF-8: err = %v", err)
	}
}

// FuzzReassembler feeds arbitrary chunk frames: no panic, no output that
// was not declared, and a correct sequence always round-trips afterwards.
func FuzzReassembler(f *testing.F) {
	// Small seeds: the fuzz body lowers frameMax, so short sequences are
	// valid, and the engine mutates small inputs far faster.
	small := []byte(`{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"hé"}]}}`)
	half := len(small) / 2
	for i, part := range [][]byte{small[:half], small[half:]} {
		l, _ := json.Marshal(map[string]any{"type": "rpc_chunk", "chunkId": "seed", "index": i, "count": 2, "byteLength": len(small), "data": base64.StdEncoding.EncodeToString(part)})
		f.Add(l, i)
	}
	f.Add([]byte(`{"type":"rpc_chunk","chunkId":"x","index":0,"count":2,"byteLength":1048576,"data":"QUJD"}`), 1)
	f.Fuzz(func(t *testing.T, line []byte, salt int) {
		r := newReassembler()
		r.frameMax = 16 // small limits so short inputs can complete
		out, err := r.push(line)
		if err == nil && out != nil {
			t.Fatalf("a single chunk completed a sequence (count must be ≥ 2)")
		}
		// Whatever happened, the next well-formed sequence works.
		r.reset()
		small := []byte(fmt.Sprintf(`{"type":"x","n":%d,"pad":"%s"}`, salt, strings.Repeat("p", 40)))
		half := len(small) / 2
		var got []byte
		for i, part := range [][]byte{small[:half], small[half:]} {
			l, _ := json.Marshal(map[string]any{"type": "rpc_chunk", "chunkId": "ok", "index": i, "count": 2, "byteLength": len(small), "data": base64.StdEncoding.EncodeToString(part)})
			if got, err = r.push(l); err != nil {
				t.Fatalf("good sequence after fuzz input: %v", err)
			}
		}
		if !bytes.Equal(got, small) {
			t.Fatalf("good sequence: got %q", got)
		}
	})
}

// TestReassembler_NoPreallocation: a chunk declares the reassembled length;
// the buffer grows with the data instead, so 400 small frames that keep
// restarting sequences (alternating ids) cost kilobytes, not 64 MiB each.
func TestReassembler_NoPreallocation(t *testing.T) {
	r := newReassembler()
	lines := make([][]byte, 2)
	for i, id := range []string{"a", "b"} {
		lines[i], _ = json.Marshal(map[string]any{"type": "rpc_chunk", "chunkId": id, "index": 0, "count": 256,
			"byteLength": defaultReassembledMax, "data": base64.StdEncoding.EncodeToString([]byte(`{"type":"x",`))})
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	errs := 0
	for i := 0; i < 400; i++ {
		if _, err := r.push(lines[i%2]); err != nil {
			errs++
		}
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("400 alternating chunk frames: %d errors, %d KiB allocated", errs, alloc>>10)
	if errs != 200 {
		t.Fatalf("%d sequences refused, want 200 (every second frame interrupts)", errs)
	}
	if alloc > 4<<20 {
		t.Fatalf("allocated %d bytes for 400 small chunk frames", alloc)
	}
}

// TestClient_ChunksNeedV2: an agent that never negotiated protocol v2 (pi,
// or omp kept on v1) gets its rpc_chunk frames refused, not reassembled.
func TestClient_ChunksNeedV2(t *testing.T) {
	p := newPipePeer(t, Options{})
	got := make(chan Event, 1)
	p.c.On(EventMessageEnd, func(ev Event) { got <- ev })
	perr := make(chan error, 4)
	p.c.OnError(func(err error) {
		select {
		case perr <- err:
		default:
		}
	})
	for _, l := range chunkLines(bigFrame(2<<20), "c1") {
		p.say(string(l))
	}
	p.say(`{"type":"agent_end","messages":[]}`)
	select {
	case err := <-perr:
		var pe *ProtocolError
		if !errors.As(err, &pe) || pe.Op != "chunk" || !strings.Contains(err.Error(), "v2") {
			t.Fatalf("error = %v", err)
		}
	case ev := <-got:
		t.Fatalf("a chunked %s was reassembled without v2", ev.Type)
	case <-time.After(10 * time.Second):
		t.Fatal("no error for a chunk without v2")
	}
	if p.c.ProtocolVersion() != 1 {
		t.Fatalf("protocol v%d", p.c.ProtocolVersion())
	}
}

// TestClient_ChunksRightAfterNegotiation: chunks that follow the
// negotiate_protocol answer at once (in the same write) are accepted: v2
// holds from that answer on, for the very next frame.
func TestClient_ChunksRightAfterNegotiation(t *testing.T) {
	p := newPipePeer(t, Options{})
	got := make(chan Event, 1)
	p.c.On(EventMessageEnd, func(ev Event) { got <- ev })
	p.say(`{"type":"ready","supportedProtocolVersions":[1,2]}`)
	m := p.recv()
	if m["type"] != "negotiate_protocol" {
		t.Fatalf("client sent %v", m)
	}
	frame := bigFrame(2 << 20)
	var b strings.Builder
	b.WriteString(`{"id":"` + m["id"].(string) + `","type":"response","command":"negotiate_protocol","success":true,"data":{"protocolVersion":2}}` + "\n")
	for _, l := range chunkLines(frame, "c1") {
		b.Write(l)
		b.WriteByte('\n')
	}
	go io.WriteString(p.agentW, b.String())
	select {
	case ev := <-got:
		if !bytes.Equal(ev.Raw(), frame) {
			t.Fatalf("reassembled %d bytes, want %d", ev.Len(), len(frame))
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no reassembled frame; errors %v", p.c.Errors())
	}
	if p.c.ProtocolVersion() != 2 {
		t.Fatalf("protocol v%d", p.c.ProtocolVersion())
	}
}

// FuzzParseChunk: parseChunk, which leaves an unescaped data string out of
// what encoding/json decodes, decodes every frame the reader passes it
// (one that scanFrame accepts) as encoding/json does.
func FuzzParseChunk(f *testing.F) {
	f.Add([]byte(`{"type":"rpc_chunk","chunkId":"x","index":0,"count":2,"byteLength":1048576,"data":"QUJD"}`))
	f.Add([]byte(`{"data":"QUJD","Data":"QUJE","DATA":null}`))
	f.Add([]byte(`{"data":"QU\u004AD","index":"1","d\u0061ta":"QUJD"}`))
	f.Add([]byte(` { "data" : "QUJD" , "count" : 2.5 } `))
	f.Add([]byte("{\"dAtA\":\"\x80\"}"))
	f.Fuzz(func(t *testing.T, line []byte) {
		if _, err := scanFrame(line); err != nil {
			return
		}
		c, raw, err := parseChunk(line)
		var want chunkFrame
		werr := json.Unmarshal(line, &want)
		if (err == nil) != (werr == nil) {
			t.Fatalf("%q: error %v, encoding/json %v", line, err, werr)
		}
		if err != nil {
			return
		}
		same := func(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
		if !same(c.Index, want.Index) || !same(c.Count, want.Count) || !same(c.ByteLength, want.ByteLength) ||
			(c.ChunkID == nil) != (want.ChunkID == nil) || c.ChunkID != nil && *c.ChunkID != *want.ChunkID ||
			(c.Data == nil) != (want.Data == nil) {
			t.Fatalf("%q: decoded %+v, encoding/json %+v", line, c, want)
		}
		if want.Data == nil || string(raw) == *want.Data {
			return
		}
		// Invalid UTF-8 stays as it is where encoding/json makes it U+FFFD:
		// neither is base64.
		_, err = decodeCanonicalBase64(raw)
		_, werr = decodeCanonicalBase64([]byte(*want.Data))
		if err == nil || werr == nil {
			t.Fatalf("%q: data %q, encoding/json %q", line, raw, *want.Data)
		}
	})
}
