package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/daemonproc"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/procd"
	"github.com/spf13/cobra"
)

// modelRole marks the built-in model's process in the daemon's metadata.
const modelRole = "builtin-model"

// Bounds of the built-in model under --daemon: one start; the restarts
// after it died, from modelRestartMin doubling to modelRestartMax apart.
const (
	modelStartTimeout = 30 * time.Second
	modelRestartMin   = 100 * time.Millisecond
	modelRestartMax   = 5 * time.Second
)

// newModelCmd is the built-in model as a process of its own: serve
// --daemon runs it in the process daemon, so that a turn streaming from it
// goes on across a planned restart of the server. It serves until its
// stdin closes or it is signalled.
func newModelCmd() *cobra.Command {
	var data, listen string
	cmd := &cobra.Command{
		Use:    modelRole,
		Short:  "Serve the built-in scripted model (for serve --daemon)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			sim := modelsim.New(modelsim.Options{Addr: listen, MaxLog: -1})
			if err := sim.Start(ctx); err != nil {
				return err
			}
			defer sim.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "url %s\n", sim.URL())
			go func() {
				// Stdin's end (the daemon's terminate closes it first) is
				// the signal to stop.
				_, _ = io.Copy(io.Discard, cmd.InOrStdin())
				cancel()
			}()
			<-ctx.Done()
			return nil
		},
	}
	// Unused but for ps: whose model it is.
	cmd.Flags().StringVar(&data, "data", "", "the data dir of the server it serves")
	cmd.Flags().StringVar(&listen, "listen", "", "the address to serve on (default: a free port on 127.0.0.1)")
	return cmd
}

// modelMeta is the built-in model's metadata in the daemon.
type modelMeta struct {
	Role string `json:"role"`
	URL  string `json:"url,omitempty"`
}

// daemonModel is the built-in model running in the process daemon, kept
// running: when it exits (killed, or its daemon died) it is started again
// on the same address, so the agents, whose homes name that address, go
// on. A server that claims the daemon takes over the model the server
// before left (started again on its address if it had exited).
type daemonModel struct {
	runner *daemonproc.Runner
	data   string
	log    *slog.Logger
	health *serveHealth
	url    string // stable for the model's life, across restarts

	proc   *daemonproc.Process // the model's process; the supervisor's alone
	stop   chan struct{}
	closed sync.Once
	wg     sync.WaitGroup
}

// healthModel names the model's entry in serveHealth.
const healthModel = "built-in model"

// startDaemonModel starts (or, on a claimed daemon, takes over) the
// built-in model and supervises it until Close.
func startDaemonModel(ctx context.Context, runner *daemonproc.Runner, data string, log *slog.Logger, health *serveHealth) (*daemonModel, error) {
	m := &daemonModel{runner: runner, data: data, log: log, health: health, stop: make(chan struct{})}
	addr := ""
	if runner.Client().Claimed() {
		a, p, err := m.takeOver(ctx)
		if err != nil {
			return nil, err
		}
		addr, m.proc = a, p
	}
	if m.proc == nil {
		sctx, cancel := context.WithTimeout(ctx, modelStartTimeout)
		p, u, err := m.start(sctx, addr)
		cancel()
		if err != nil {
			return nil, err
		}
		m.proc, m.url = p, u
	} else {
		m.url = "http://" + addr + "/v1"
	}
	m.wg.Add(1)
	go m.supervise()
	return m, nil
}

// URL is the model's address; it does not change across its restarts.
func (m *daemonModel) URL() string { return m.url }

// Close stops supervising and lets go of the model, which runs on in the
// daemon (handed over with it, or ended with it). Idempotent.
func (m *daemonModel) Close() {
	m.closed.Do(func() {
		close(m.stop)
		m.wg.Wait()
		if m.proc != nil {
			m.proc.Detach()
		}
	})
}

// takeOver finds the model the server before left: the address it served
// on, and its process if it still runs. Other model records (exited, or
// more than one) are ended.
func (m *daemonModel) takeOver(ctx context.Context) (string, *daemonproc.Process, error) {
	pd := m.runner.Client()
	procs, err := pd.List(ctx, procd.ModePipe)
	if err != nil {
		return "", nil, err
	}
	addr := ""
	var keep *daemonproc.Process
	for _, pi := range procs {
		var meta modelMeta
		if json.Unmarshal(pi.Metadata, &meta) != nil || meta.Role != modelRole {
			continue
		}
		a := modelAddr(meta.URL)
		if keep == nil && pi.Running && a != "" && pi.Pipe != nil {
			h := daemonproc.Handle{Instance: pd.InstanceID(), ID: pi.ID, Output: pi.Pipe.OutputPath, Stderr: pi.Pipe.StderrPath}
			if p, err := m.runner.Attach(ctx, h, pi.Pipe.OutputBytes); err == nil {
				addr, keep = a, p
				continue
			}
		}
		if addr == "" && a != "" {
			addr = a // an exited model's address: the new one serves there
		}
		if _, err := pd.Terminate(ctx, pi.ID); err != nil && !errors.Is(err, procd.ErrNotFound) {
			m.log.Warn("ending a stale built-in model", "id", pi.ID, "err", err)
		}
	}
	return addr, keep, nil
}

// modelAddr is the host:port of a model URL, "" if it has none.
func modelAddr(u string) string {
	pu, err := url.Parse(u)
	if err != nil || pu.Host == "" {
		return ""
	}
	if _, _, err := net.SplitHostPort(pu.Host); err != nil {
		return ""
	}
	return pu.Host
}

// start runs the model in the daemon on addr ("" for a free port) and
// returns its process and URL once it serves.
func (m *daemonModel) start(ctx context.Context, addr string) (*daemonproc.Process, string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	pd := m.runner.Client()
	argv := []string{exe, modelRole, "--data", m.data}
	if addr != "" {
		argv = append(argv, "--listen", addr)
	}
	b, _ := json.Marshal(modelMeta{Role: modelRole})
	out, errPath := filepath.Join(m.data, "model.out"), filepath.Join(m.data, "model.err")
	info, err := pd.CreatePipe(ctx, procd.PipeSpec{Argv: argv, Cwd: m.data, Env: os.Environ(),
		OutputPath: out, StderrPath: errPath, Metadata: b})
	if err != nil {
		return nil, "", err
	}
	p, u, err := m.served(ctx, daemonproc.Handle{Instance: pd.InstanceID(), ID: info.ID, Output: out, Stderr: errPath})
	if err != nil {
		tctx, cancel := context.WithTimeout(context.Background(), daemonproc.StopTimeout)
		_, _ = pd.Terminate(tctx, info.ID)
		cancel()
		return nil, "", err
	}
	return p, u, nil
}

// served attaches to a model just started and reads the URL it serves
// on; its metadata then names it.
func (m *daemonModel) served(ctx context.Context, h daemonproc.Handle) (*daemonproc.Process, string, error) {
	p, err := m.runner.Attach(ctx, h, 0)
	if err != nil {
		return nil, "", fmt.Errorf("the built-in model did not start: %w", err)
	}
	type line struct {
		s   string
		err error
	}
	got := make(chan line, 1)
	go func() {
		s, err := bufio.NewReader(p.Stdout()).ReadString('\n')
		got <- line{s, err}
	}()
	var l line
	select {
	case l = <-got:
	case <-ctx.Done():
		p.CloseOutput()
		<-got
		p.Detach()
		return nil, "", fmt.Errorf("the built-in model did not start: %w", ctx.Err())
	}
	u, ok := strings.CutPrefix(strings.TrimSpace(l.s), "url ")
	if l.err != nil || !ok {
		p.Detach()
		return nil, "", errors.New("the built-in model did not start (see model.err in the data dir)")
	}
	b, _ := json.Marshal(modelMeta{Role: modelRole, URL: u})
	if err := m.runner.Client().SetMetadata(ctx, h.ID, b); err != nil {
		p.Detach()
		return nil, "", err
	}
	return p, u, nil
}

// supervise starts the model again on its address whenever it exits,
// until Close; the server is unhealthy meanwhile.
func (m *daemonModel) supervise() {
	defer m.wg.Done()
	addr := modelAddr(m.url)
	for {
		select {
		case <-m.stop:
			return
		case <-m.proc.Exited():
		}
		m.log.Error("the built-in model exited; starting it again on its address", "url", m.url, "err", m.proc.ExitErr())
		m.health.set(healthModel, fmt.Errorf("the built-in model exited (%v); starting it again", m.proc.ExitErr()))
		_ = m.proc.Stop(context.Background()) // its record and files
		wait := modelRestartMin
		for {
			ctx, cancel := context.WithTimeout(context.Background(), modelStartTimeout)
			go func() {
				select {
				case <-m.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			p, u, err := m.start(ctx, addr)
			cancel()
			if err == nil && u != m.url {
				// Served elsewhere: agents would not reach it. Never
				// happens with --listen; guarded all the same.
				_ = p.Stop(context.Background())
				err = fmt.Errorf("it serves %s, not %s", u, m.url)
			}
			if err == nil {
				m.proc = p
				break
			}
			m.log.Warn("starting the built-in model again failed; retrying", "err", err, "in", wait)
			t := time.NewTimer(wait)
			select {
			case <-m.stop:
				t.Stop()
				m.proc = nil
				return
			case <-t.C:
			}
			wait = min(2*wait, modelRestartMax)
		}
		m.health.clear(healthModel)
		m.log.Info("the built-in model serves again", "url", m.url)
	}
}

// endModels ends the built-in models a claimed daemon still runs for a
// server that uses none (--model, or a custom command).
func endModels(ctx context.Context, pd *procd.Client, log *slog.Logger) {
	procs, err := pd.List(ctx, procd.ModePipe)
	if err != nil {
		log.Warn("listing the daemon's processes", "err", err)
		return
	}
	for _, pi := range procs {
		var meta modelMeta
		if json.Unmarshal(pi.Metadata, &meta) == nil && meta.Role == modelRole {
			if _, err := pd.Terminate(ctx, pi.ID); err != nil && !errors.Is(err, procd.ErrNotFound) {
				log.Warn("ending the built-in model the server before left", "id", pi.ID, "err", err)
			}
		}
	}
}
