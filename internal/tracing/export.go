package tracing

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// exportBatch is the most spans sent in one export.
const exportBatch = 512

// queueProcessor exports ended spans in batches from a bounded queue, on
// one goroutine of its own: a span's end never waits for the collector.
// A span that finds the queue full is dropped and counted, and so are the
// spans of an export that failed (the exporter's own retries were spent).
// The SDK's batch processor drops likewise but does not say how many.
type queueProcessor struct {
	exp      sdktrace.SpanExporter
	log      *slog.Logger
	interval time.Duration

	q       chan sdktrace.ReadOnlySpan
	flushes chan chan struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once

	exported, dropped, failedExports atomic.Uint64
	lastLog                          atomic.Int64 // unix nanos of the last failure logged
}

func newQueueProcessor(exp sdktrace.SpanExporter, size int, interval time.Duration, log *slog.Logger) *queueProcessor {
	p := &queueProcessor{
		exp: exp, log: log, interval: interval,
		q: make(chan sdktrace.ReadOnlySpan, size), flushes: make(chan chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go p.run()
	return p
}

func (p *queueProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues s; it never waits.
func (p *queueProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	select {
	case p.q <- s:
	default:
		p.dropped.Add(1)
	}
}

func (p *queueProcessor) run() {
	defer close(p.done)
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	var batch []sdktrace.ReadOnlySpan
	send := func() {
		if len(batch) == 0 {
			return
		}
		p.export(batch)
		batch = nil
	}
	for {
		select {
		case s := <-p.q:
			batch = append(batch, s)
			if len(batch) >= exportBatch {
				send()
			}
		case <-tick.C:
			send()
		case reply := <-p.flushes:
			batch = p.drain(batch)
			send()
			close(reply)
		case <-p.stop:
			batch = p.drain(batch)
			send()
			return
		}
	}
}

// drain takes every span queued now into batch, exporting full batches.
func (p *queueProcessor) drain(batch []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	for {
		select {
		case s := <-p.q:
			batch = append(batch, s)
			if len(batch) >= exportBatch {
				p.export(batch)
				batch = nil
			}
		default:
			return batch
		}
	}
}

// exportTimeout bounds one export, the exporter's retries included.
const exportTimeout = 15 * time.Second

func (p *queueProcessor) export(batch []sdktrace.ReadOnlySpan) {
	ctx, cancel := context.WithTimeout(context.Background(), exportTimeout)
	defer cancel()
	if err := p.exp.ExportSpans(ctx, batch); err != nil {
		p.dropped.Add(uint64(len(batch)))
		p.failedExports.Add(1)
		// A dead collector fails every export: say so once a minute.
		now := time.Now().UnixNano()
		if last := p.lastLog.Load(); now-last > int64(time.Minute) && p.lastLog.CompareAndSwap(last, now) {
			p.log.Warn("tracing: exporting spans failed; they are dropped (counted in /metrics)", "spans", len(batch), "err", err)
		}
		return
	}
	p.exported.Add(uint64(len(batch)))
}

// ForceFlush exports every span ended before it, or gives up when ctx ends.
func (p *queueProcessor) ForceFlush(ctx context.Context) error {
	reply := make(chan struct{})
	select {
	case p.flushes <- reply:
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-reply:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown exports what is queued and stops; the spans still queued when
// ctx ends are dropped with the export under way.
func (p *queueProcessor) Shutdown(ctx context.Context) error {
	p.once.Do(func() { close(p.stop) })
	select {
	case <-p.done:
	case <-ctx.Done():
		// The export under way ends by its own timeout; the goroutine
		// then ends.
		return ctx.Err()
	}
	return p.exp.Shutdown(ctx)
}
