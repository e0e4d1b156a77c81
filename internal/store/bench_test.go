package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkAppend measures events persisted per second with fsync on
// (synchronous=FULL): 256 concurrent writers over 1,000 rooms, one event
// per Write, so throughput comes from group commit.
//
//	go test ./internal/store -run '^$' -bench Append -benchtime 20000x
func BenchmarkAppend(b *testing.B) {
	for _, sync := range []bool{true, false} {
		name := "fsync"
		if !sync {
			name = "nosync"
		}
		b.Run(name, func(b *testing.B) {
			db, err := Open(context.Background(), filepath.Join(b.TempDir(), "agenthost.db"), Options{NoSync: !sync})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			var n atomic.Int64
			data := map[string]string{"turn_id": "t-0001", "text": "a delta of streamed assistant text, about eighty bytes long."}
			b.SetParallelism(128) // 256 writers on 2 cores
			start := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					room := fmt.Sprintf("room-%03d", n.Add(1)%1000)
					if err := db.Write(ctx, func(w *Writer) error {
						_, err := w.Append(room, "text.delta", data)
						return err
					}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		})
	}
}
