// Package store is agenthost's embedded store: SQLite (modernc.org/sqlite,
// no cgo) in WAL mode, holding rooms, messages, turns, approvals,
// questions and custody receipts beside an append-only event log with a
// per-room sequence number that increases by exactly one per event.
//
// Writes go through one writer goroutine that commits every write queued
// while the previous commit ran in a single transaction (group commit), so
// many concurrent writers share one fsync. A Write returns nil only once
// its transaction is committed with synchronous=FULL: what it wrote
// survives a SIGKILL of the host. Each Write runs under its own savepoint,
// so one failing write never undoes another in the same batch.
//
// Reads use a separate pool and see committed data while writes go on, so
// the event log can be replayed from any sequence number while it grows.
//
// The room package owns the interface it needs from a store; this package
// is its SQLite implementation, kept free of room logic so the event log
// can later move to another engine.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/record"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Defaults for Options.
const (
	// DefaultQueue bounds the writes waiting for the writer.
	DefaultQueue = 4096
	// DefaultMaxBatch bounds the writes committed in one transaction, so
	// one commit's latency stays small under a flood.
	DefaultMaxBatch = 1024
	// DefaultBusyTimeout is SQLite's wait for a lock held by another
	// connection (a checkpoint, a reader upgrading).
	DefaultBusyTimeout = 5 * time.Second
	// DefaultReadConns is the size of the read pool.
	DefaultReadConns = 4
)

// Checkpoints. SQLite's default moves the WAL into the database file
// inside the commit that takes the WAL past 1000 pages: that commit, and
// every Write waiting behind it, waits for the page copies and the
// database file's fsync (most of the submit benchmark's p99). Here a
// goroutine of its own does it on a connection of its own, a while after
// commits, while the writer goes on (a PASSIVE checkpoint takes no lock a
// writer waits for). The writer checkpoints only past walFallbackPages,
// should the checkpointer fall that far behind.
const (
	checkpointDelay  = 100 * time.Millisecond
	walFallbackPages = 10000
)

var (
	// ErrClosed is returned by calls after Close.
	ErrClosed = record.ErrClosed
	// ErrLocked is returned by Open when another process holds the store.
	ErrLocked = errors.New("store: in use by another process")
	// ErrNotFound is returned for an unknown room, message, approval...
	ErrNotFound = record.ErrNotFound
	// ErrNewerSchema is returned by Open for a store written by a newer
	// agenthost, which this one must not touch.
	ErrNewerSchema = errors.New("store: schema is newer than this agenthost")
	// ErrConflict is returned when a write finds the row in a state that
	// forbids it (an approval already resolved).
	ErrConflict = record.ErrConflict
)

// Options configure a store. The zero value is usable.
type Options struct {
	// Queue bounds the writes waiting for the writer (default 4096); a
	// Write waits for room, bounded by its context.
	Queue int
	// MaxBatch bounds the writes in one transaction (default 1024).
	MaxBatch int
	// ReadConns is the read pool's size (default 4).
	ReadConns int
	// NoSync sets synchronous=NORMAL: a commit is then durable against a
	// crash of the process but not of the machine. For benchmarks only.
	NoSync bool
	Logger *slog.Logger
}

func (o *Options) fill() {
	if o.Queue <= 0 {
		o.Queue = DefaultQueue
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.ReadConns <= 0 {
		o.ReadConns = DefaultReadConns
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// DB is an open store. Safe for concurrent use; Close it last.
type DB struct {
	opts  Options
	log   *slog.Logger
	lock  *os.File
	wdb   *sql.DB // one connection, owned by the writer goroutine
	rdb   *sql.DB // read pool
	cdb   *sql.DB // one connection, the checkpointer's
	reqs  chan *writeReq
	quit  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	shut  bool
	watch map[string]map[chan struct{}]struct{}
	taps  map[*tap]struct{}
	// seqs caches each room's last sequence number; only the writer
	// goroutine touches it.
	seqs map[string]int64
	// recent answers a live stream's reads of what was just committed.
	recent *recent
	// ckpt wakes the checkpointer after a commit; ckptDone is closed
	// when it stops. onCheckpoint, when set (tests), is told each
	// checkpoint's WAL frames and how many of them it moved.
	ckpt         chan struct{}
	ckptDone     chan struct{}
	onCheckpoint func(frames, moved int)
	// wstmts are the writer's statements, prepared once on its one
	// connection and used by every batch's transaction (SQLite otherwise
	// parses a statement at every exec); only the writer goroutine
	// touches them. rstmts are the readers' (smu guards them); each is
	// prepared on a pool connection the first time it runs there.
	wstmts      map[string]*sql.Stmt
	want        []string // statements to prepare after this batch
	smu         sync.Mutex
	rstmts      map[string]*sql.Stmt
	stmtsClosed bool
}

// maxStmts bounds each statement cache. The queries are the store's own
// constants, a few dozen; past the bound a query is prepared per call.
const maxStmts = 128

// readStmt is the readers' prepared statement for query (nil when the
// cache is full). It prepares outside the lock: a reader holding a pool
// connection may wait for the lock, so the lock's holder must not wait
// for a connection.
func (db *DB) readStmt(ctx context.Context, query string) (*sql.Stmt, error) {
	db.smu.Lock()
	st, ok := db.rstmts[query]
	full := len(db.rstmts) >= maxStmts
	db.smu.Unlock()
	if ok || full {
		return st, nil
	}
	st, err := db.rdb.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	db.smu.Lock()
	defer db.smu.Unlock()
	if had, ok := db.rstmts[query]; ok || db.stmtsClosed {
		_ = st.Close() // another reader's came first, or the store closed
		return had, nil
	}
	if db.rstmts == nil {
		db.rstmts = map[string]*sql.Stmt{}
	}
	db.rstmts[query] = st
	return st, nil
}

// query runs a read through its prepared statement.
func (db *DB) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := db.readStmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return db.rdb.QueryContext(ctx, query, args...)
	}
	return st.QueryContext(ctx, args...)
}

// snapshot runs fn's reads in one read transaction, so that they see one
// state of the store whatever commits meanwhile (in WAL mode, the state
// as of its first read): a room's last sequence number and its usage
// totals, read in two queries, then agree. queries are the ones fn runs:
// their statements are prepared before the transaction takes its pool
// connection (preparing one inside it would wait for a second connection,
// which readers holding theirs may never give back).
func (db *DB) snapshot(ctx context.Context, queries []string, fn func(q snapReader) error) error {
	for _, q := range queries {
		if _, err := db.readStmt(ctx, q); err != nil {
			return wrap("read", err)
		}
	}
	tx, err := db.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return wrap("read", err)
	}
	defer func() { _ = tx.Rollback() }() // read only: nothing to commit
	return fn(snapReader{db: db, tx: tx})
}

// snapReader reads inside a snapshot, through the readers' prepared
// statements (a query whose statement is not cached runs as it is).
type snapReader struct {
	db *DB
	tx *sql.Tx
}

// cached is the readers' prepared statement for query, if any; it never
// prepares one.
func (db *DB) cached(query string) *sql.Stmt {
	db.smu.Lock()
	defer db.smu.Unlock()
	return db.rstmts[query]
}

func (r snapReader) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := r.db.cached(query); st != nil {
		return r.tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	return r.tx.QueryContext(ctx, query, args...)
}

func (r snapReader) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	if st := r.db.cached(query); st != nil {
		return r.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return r.tx.QueryRowContext(ctx, query, args...)
}

// queryRow is query for one row; an error comes with Scan.
func (db *DB) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := db.readStmt(ctx, query)
	if err != nil || st == nil {
		return db.rdb.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

// prepareWanted prepares the writer's statements a batch asked for, once
// its transaction is over: the writer has one connection, which a
// transaction holds. Only the writer goroutine calls it.
func (db *DB) prepareWanted() {
	for _, q := range db.want {
		if len(db.wstmts) >= maxStmts {
			break
		}
		st, err := db.wdb.PrepareContext(context.Background(), q)
		if err != nil {
			continue // prepared per batch, as before
		}
		if db.wstmts == nil {
			db.wstmts = map[string]*sql.Stmt{}
		}
		db.wstmts[q] = st
	}
	db.want = db.want[:0]
}

// closeStmts closes the cached statements (after the writer stopped).
func (db *DB) closeStmts() error {
	var err error
	for _, st := range db.wstmts {
		err = errors.Join(err, st.Close())
	}
	db.smu.Lock()
	defer db.smu.Unlock()
	for _, st := range db.rstmts {
		err = errors.Join(err, st.Close())
	}
	db.rstmts, db.stmtsClosed = nil, true
	return err
}

// Open opens (creating if needed) the store at path, takes its lock file
// (path + ".lock") so that a second process on the same store fails with
// ErrLocked (after a short grace: see lockGrace), and brings the schema
// up to date.
func Open(ctx context.Context, path string, opts Options) (*DB, error) {
	opts.fill()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	lock, err := lockFile(ctx, path+".lock", lockGrace)
	if err != nil {
		return nil, err
	}
	if err := private(path); err != nil {
		_ = lock.Close()
		return nil, err
	}
	db := &DB{
		opts: opts, log: opts.Logger, lock: lock,
		reqs:     make(chan *writeReq, opts.Queue),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		ckpt:     make(chan struct{}, 1),
		ckptDone: make(chan struct{}),
		watch:    map[string]map[chan struct{}]struct{}{},
		taps:     map[*tap]struct{}{},
		seqs:     map[string]int64{},
		recent:   newRecent(),
	}
	sync := "FULL"
	if opts.NoSync {
		sync = "NORMAL"
	}
	dsn := fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(%s)&_pragma=foreign_keys(1)&_pragma=wal_autocheckpoint(%d)&_txlock=immediate",
		path, DefaultBusyTimeout.Milliseconds(), sync, walFallbackPages)
	if db.wdb, err = sql.Open("sqlite", dsn); err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	db.wdb.SetMaxOpenConns(1)
	db.wdb.SetConnMaxIdleTime(0)
	if err := migrate(ctx, db.wdb); err != nil {
		_ = db.wdb.Close()
		_ = lock.Close()
		return nil, err
	}
	rdsn := fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=query_only(1)", path, DefaultBusyTimeout.Milliseconds())
	if db.rdb, err = sql.Open("sqlite", rdsn); err != nil {
		_ = db.wdb.Close()
		_ = lock.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	db.rdb.SetMaxOpenConns(opts.ReadConns)
	cdsn := fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)", path, DefaultBusyTimeout.Milliseconds())
	if db.cdb, err = sql.Open("sqlite", cdsn); err != nil {
		_ = db.rdb.Close()
		_ = db.wdb.Close()
		_ = lock.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	db.cdb.SetMaxOpenConns(1)
	go db.writeLoop()
	go db.checkpointLoop()
	return db, nil
}

// private makes the store's file the server's alone (0600) before SQLite
// opens it, creating it empty if needed, and narrows an older store's
// looser mode and that of its WAL and shared-memory files (SQLite creates
// those with the store file's mode).
func private(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	err = f.Chmod(0o600)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	for _, side := range []string{"-wal", "-shm"} {
		if cerr := os.Chmod(path+side, 0o600); err == nil && !errors.Is(cerr, fs.ErrNotExist) {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// checkpointLoop checkpoints the WAL a while after commits (see
// checkpointDelay) until Close.
func (db *DB) checkpointLoop() {
	defer close(db.ckptDone)
	for {
		select {
		case <-db.ckpt:
		case <-db.quit:
			return
		}
		// The commits of a while share one checkpoint (and its fsync).
		t := time.NewTimer(checkpointDelay)
		select {
		case <-t.C:
		case <-db.quit:
			t.Stop()
			return
		}
		db.checkpoint()
	}
}

// checkpoint moves what it can of the WAL into the database file without
// waiting for readers or the writer (PASSIVE). The next write starts the
// WAL over once all of it is moved and no reader still reads from it.
func (db *DB) checkpoint() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var busy, frames, moved int
	err := db.cdb.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &moved)
	if err != nil {
		// The next commit's wake-up tries again; past walFallbackPages
		// the writer checkpoints itself.
		db.log.Warn("store: checkpoint failed", "err", err)
		return
	}
	if db.onCheckpoint != nil {
		db.onCheckpoint(frames, moved)
	}
}

// Close lets queued writes finish, stops the writer and closes the
// database. Later calls return ErrClosed.
func (db *DB) Close() error {
	db.mu.Lock()
	if db.shut {
		db.mu.Unlock()
		return ErrClosed
	}
	db.shut = true
	for _, set := range db.watch {
		for ch := range set {
			close(ch)
		}
	}
	db.watch = nil
	db.mu.Unlock()
	close(db.quit)
	<-db.done
	<-db.ckptDone
	err := errors.Join(db.closeStmts(), db.rdb.Close(), db.cdb.Close(), db.wdb.Close())
	// The lock goes last: another process may open the store only once
	// this one has let go of it.
	err = errors.Join(err, db.lock.Close())
	if err != nil {
		return fmt.Errorf("store: close: %w", err)
	}
	return nil
}

// Watch returns a channel that receives a value after each commit that
// appended events to room (several commits may coalesce into one value),
// and a function that stops the watch. The channel is closed when the
// store closes. A watcher reads what is new with Events after its last
// seen sequence number, so it never loses an event to a slow read.
func (db *DB) Watch(room string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.shut {
		close(ch)
		return ch, func() {}
	}
	set := db.watch[room]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		db.watch[room] = set
	}
	set[ch] = struct{}{}
	db.recent.watch(room)
	return ch, func() {
		db.mu.Lock()
		defer db.mu.Unlock()
		if s := db.watch[room]; s != nil {
			if _, ok := s[ch]; ok {
				delete(s, ch)
				db.recent.unwatch(room)
				if len(s) == 0 {
					delete(db.watch, room)
				}
			}
		}
	}
}

type tap struct{ fn func([]Event) }

// Tap calls fn after each commit that appended events, in any room, with
// those events in the order they were appended (their Data shared: fn
// must not change it), until stop is called. fn runs on the writer's
// goroutine, between one commit and the next: it must be quick and must
// not call Write. A store-wide count of what is written (metrics) then
// costs nothing per room.
func (db *DB) Tap(fn func([]Event)) (stop func()) {
	t := &tap{fn: fn}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.shut {
		return func() {}
	}
	db.taps[t] = struct{}{}
	return func() {
		db.mu.Lock()
		defer db.mu.Unlock()
		delete(db.taps, t)
	}
}

// tapsNow returns the taps set now (nil for none).
func (db *DB) tapsNow() []*tap {
	db.mu.Lock()
	defer db.mu.Unlock()
	if len(db.taps) == 0 {
		return nil
	}
	out := make([]*tap, 0, len(db.taps))
	for t := range db.taps {
		out = append(out, t)
	}
	return out
}

func (db *DB) notify(rooms map[string]struct{}) {
	db.mu.Lock()
	defer db.mu.Unlock()
	for room := range rooms {
		for ch := range db.watch[room] {
			select {
			case ch <- struct{}{}:
			default: // a signal is pending; the watcher reads all anyway
			}
		}
	}
}

// writeReq is one Write waiting for the writer. state moves from pending
// to running (the writer took it) or to abandoned (its caller gave up
// first), once, so a caller never returns while its write may still land.
type writeReq struct {
	ctx   context.Context
	fn    func(*Writer) error
	state atomic.Int32
	err   error
	done  chan struct{}
}

const (
	reqPending int32 = iota
	reqRunning
	reqAbandoned
)

// Write runs fn in a write transaction, batched with other writes, and
// returns once that transaction is committed (nil) or fn's changes were
// rolled back (fn's error, or the commit's). If ctx ends before the writer
// takes the write, nothing is written and ctx's error is returned; once
// taken, Write waits for the commit, which SQLite's busy timeout bounds.
// fn must not block or keep w.
func (db *DB) Write(ctx context.Context, fn func(w *Writer) error) error {
	r := &writeReq{ctx: ctx, fn: fn, done: make(chan struct{})}
	db.mu.Lock()
	shut := db.shut
	db.mu.Unlock()
	if shut {
		return ErrClosed
	}
	select {
	case db.reqs <- r:
	case <-ctx.Done():
		return fmt.Errorf("store: write: %w", ctx.Err())
	case <-db.quit:
		return ErrClosed
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		if r.state.CompareAndSwap(reqPending, reqAbandoned) {
			return fmt.Errorf("store: write: %w", ctx.Err())
		}
	case <-db.done:
		// Queued as Close stopped the writer: never taken.
		if r.state.CompareAndSwap(reqPending, reqAbandoned) {
			return ErrClosed
		}
	}
	<-r.done // taken: its commit is under way
	return r.err
}

func (db *DB) writeLoop() {
	defer close(db.done)
	batch := make([]*writeReq, 0, db.opts.MaxBatch)
	for {
		var first *writeReq
		select {
		case first = <-db.reqs:
		case <-db.quit:
			// Finish what was queued before Close.
			for {
				select {
				case r := <-db.reqs:
					batch = append(batch[:0], r)
					db.drain(&batch)
					db.commit(batch)
				default:
					return
				}
			}
		}
		batch = append(batch[:0], first)
		db.drain(&batch)
		db.commit(batch)
	}
}

// drain adds the writes already queued, up to MaxBatch.
func (db *DB) drain(batch *[]*writeReq) {
	for len(*batch) < db.opts.MaxBatch {
		select {
		case r := <-db.reqs:
			*batch = append(*batch, r)
		default:
			return
		}
	}
}

func (db *DB) commit(batch []*writeReq) {
	live := batch[:0]
	for _, r := range batch {
		if r.state.CompareAndSwap(reqPending, reqRunning) {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		return
	}
	finish := func(err error) {
		for _, r := range live {
			if r.err == nil {
				r.err = err
			}
			close(r.done)
		}
	}
	ctx := context.Background()
	tx, err := db.wdb.BeginTx(ctx, nil)
	if err != nil {
		finish(fmt.Errorf("store: begin: %w", err))
		return
	}
	touched := map[string]struct{}{}
	// A tap set while the batch runs sees the next one.
	taps := db.tapsNow()
	w := &Writer{tx: tx, db: db, tapped: taps != nil}
	for _, r := range live {
		mark, rmark := len(w.appended), len(w.recent)
		if err := db.runOne(ctx, w, r); err != nil {
			w.appended, w.recent = w.appended[:mark], w.recent[:rmark]
			r.err = err
			continue
		}
		for room := range w.rooms {
			touched[room] = struct{}{}
		}
	}
	db.recent.committing(w.recent)
	if err := tx.Commit(); err != nil {
		// Nothing of the batch landed: forget cached sequence numbers.
		clear(db.seqs)
		db.recent.clear()
		db.log.Error("store: commit failed", "err", err, "writes", len(live))
		finish(fmt.Errorf("store: commit: %w", err))
		return
	}
	// The taps, and the recent events, see the batch before anyone
	// learns of its commit, so a count or a read after a Write returns
	// (or after a watcher wakes) includes it.
	db.recent.add(w.recent)
	if len(w.appended) > 0 {
		for _, t := range taps {
			t.fn(w.appended)
		}
	}
	finish(nil)
	select {
	case db.ckpt <- struct{}{}:
	default: // the checkpointer is woken already
	}
	if len(touched) > 0 {
		db.notify(touched)
	}
	if len(db.want) > 0 {
		db.prepareWanted()
	}
}

// runOne runs one write under a savepoint; on failure its changes, and
// the sequence numbers it took, are undone.
func (db *DB) runOne(ctx context.Context, w *Writer, r *writeReq) (err error) {
	if _, err := w.exec("SAVEPOINT w"); err != nil {
		return fmt.Errorf("store: savepoint: %w", err)
	}
	w.rooms = map[string]struct{}{}
	w.taken = map[string]int64{}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("store: write panicked: %v", p)
		}
		if err != nil {
			for room, before := range w.taken {
				if before < 0 {
					delete(db.seqs, room)
				} else {
					db.seqs[room] = before
				}
			}
			w.rooms = nil
			if _, rerr := w.tx.ExecContext(ctx, "ROLLBACK TO w; RELEASE w"); rerr != nil {
				err = errors.Join(err, fmt.Errorf("store: rollback: %w", rerr))
			}
			return
		}
		if _, rerr := w.exec("RELEASE w"); rerr != nil {
			err = fmt.Errorf("store: release: %w", rerr)
		}
	}()
	return r.fn(w)
}
