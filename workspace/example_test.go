package workspace_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/modeltest"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/sqlitestore"
	"github.com/agenthost/agenthost/transport"
	"github.com/agenthost/agenthost/workspace"
)

// A room on omp whose workspace is a checkout of a git repository, with
// per-turn snapshots: what a turn changed, and the turn undone.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := must(os.MkdirTemp("", "workspace"))
	defer os.RemoveAll(dir)
	repo := gitRepo(filepath.Join(dir, "repos", "notes"), "README", "notes\n")

	model := must(modeltest.Start(ctx, modeltest.Options{}))
	defer model.Close()
	st := must(sqlitestore.Open(ctx, filepath.Join(dir, "agenthost.db"), sqlitestore.Options{}))
	defer st.Close()
	cust := must(custody.New(custody.Options{}))
	defer cust.Close()
	omp := must(transport.NewRPC(transport.Options{Custodian: cust, ModelURL: model.URL()}))
	snaps := workspace.NewSnapshots(workspace.SnapshotOptions{})
	defer snaps.Close()
	rooms := filepath.Join(dir, "rooms")
	git := must(workspace.NewGit(workspace.GitOptions{Root: filepath.Join(dir, "git"),
		FileRoots: []string{filepath.Join(dir, "repos")}, Denied: []string{rooms}}))
	m := must(room.New(room.Options{Store: st, Transport: omp, Root: rooms, Snapshots: snaps, Sources: git,
		Config: room.Config{ApprovalMode: room.ApprovalYolo}}))
	check(m.Start(ctx))
	defer func() {
		check(m.Close())
		check(m.Wait(ctx))
	}()

	_ = must(m.SetSettings(ctx, "notes", room.Settings{Workspace: &room.Workspace{Git: "file://" + repo, Ref: "main"}}))
	acc := must(m.Submit(ctx, "notes", room.Message{
		Text: `[[tool:bash {"command":"cat README && echo more >> README && echo todo > TODO"}]]`}))
	var tool event.ToolEnded
	ev := next(ctx, m, "notes", acc.Seq, event.TypeToolEnded, &tool)
	readme, _, _ := strings.Cut(tool.Output, "\n")
	fmt.Println("the agent read:", readme)
	var end event.TurnEnded
	next(ctx, m, "notes", ev.Seq, event.TypeTurnEnded, &end)

	diff := must(m.TurnDiff(ctx, "notes", end.TurnID))
	for _, f := range diff.Files {
		fmt.Println(f.Status, f.Path)
	}
	reverted := must(m.Revert(ctx, "notes", end.TurnID))
	fmt.Println("reverted:", reverted.Files)
	// Output:
	// the agent read: notes
	// modified README
	// added TODO
	// reverted: [README TODO]
}

// gitRepo makes a repository at dir with one commit of one file on main.
func gitRepo(dir, name, text string) string {
	check(os.MkdirAll(dir, 0o755))
	check(os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", name},
		{"-c", "user.name=ex", "-c", "user.email=ex@example.com", "commit", "-q", "-m", "first"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			log.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	return dir
}

// next decodes into v the room's first event of type typ after seq.
func next(ctx context.Context, m *room.Manager, roomID string, seq int64, typ string, v any) record.Event {
	watch, stop := m.Watch(roomID)
	defer stop()
	for {
		for _, ev := range must(m.Events(ctx, roomID, seq, 0)) {
			if seq = ev.Seq; ev.Type == typ {
				check(json.Unmarshal(ev.Data, v))
				return ev
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			log.Fatalf("no %s event: %v", typ, ctx.Err())
		}
	}
}

func must[T any](v T, err error) T {
	check(err)
	return v
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
