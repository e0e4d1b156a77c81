package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"
)

// floodFrames builds n message_update frames of about 1 KB, the shape omp
// streams for a short answer.
func floodFrames(n int) []byte {
	var b bytes.Buffer
	text := ""
	for i := 0; i < n; i++ {
		text += "lorem ipsum dolor sit amet "
		if len(text) > 800 {
			text = text[len(text)-800:]
		}
		// "type" first, as the agents write it (a map would sort it last).
		f, _ := json.Marshal(struct {
			Type    string         `json:"type"`
			Message map[string]any `json:"message"`
			Event   map[string]any `json:"assistantMessageEvent"`
		}{
			Type: "message_update",
			Message: map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": text}},
				"api": "openai-completions", "provider": "fake", "model": "fake-model",
				"usage": map[string]any{"input": 10, "output": i, "totalTokens": 10 + i}, "stopReason": "stop", "timestamp": 1764400000000},
			Event: map[string]any{"type": "text_delta", "contentIndex": 0, "delta": "amet "},
		})
		b.Write(f)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (nopWriter) Close() error                { return nil }

// BenchmarkClient_Flood: frames read, framed, validated, typed and handed
// to a listener on the dispatcher, per second; bytes per second; allocations
// per frame. Every frame must reach the listener.
func BenchmarkClient_Flood(b *testing.B) {
	for _, mode := range []string{"listener", "no-listener"} {
		b.Run(mode, func(b *testing.B) {
			const n = 20000
			data := floodFrames(n)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			b.ResetTimer()
			t0 := time.Now()
			for i := 0; i < b.N; i++ {
				c := New(io.NopCloser(bytes.NewReader(data)), nopWriter{}, Options{NoHandshake: true})
				got := 0
				all := make(chan struct{})
				if mode == "listener" {
					c.On(EventMessageUpdate, func(Event) {
						got++
						if got == n {
							close(all)
						}
					})
				}
				if err := c.Start(context.Background()); err != nil {
					b.Fatal(err)
				}
				<-c.Done()
				if mode == "listener" {
					<-all
				}
				c.Close()
			}
			el := time.Since(t0)
			b.ReportMetric(float64(n*b.N)/el.Seconds(), "frames/s")
		})
	}
}

// BenchmarkScanFrame: validation and type extraction alone.
func BenchmarkScanFrame(b *testing.B) {
	data := floodFrames(1000)
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, l := range lines {
			if _, err := scanFrame(l); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkJSONDecode: what a plain encoding/json decode of every
// frame costs, for comparison with BenchmarkScanFrame.
func BenchmarkJSONDecode(b *testing.B) {
	data := floodFrames(1000)
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, l := range lines {
			var m map[string]any
			if err := json.Unmarshal(l, &m); err != nil {
				b.Fatal(err)
			}
		}
	}
}
