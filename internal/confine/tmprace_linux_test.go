package confine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tmpRaceRounds is how many agent starts race the survivor.
const tmpRaceRounds = 8

// tmpRacer is a process left in the room (a detached survivor, as on a
// non-root server without a cgroup): for as long as it runs it tries to
// swap the TMPDIR the next start makes ("tmp" beside the home, in the
// room's folder) for a link to the data dir, and to plant a link to the
// data dir in it. It says "tried" after each round, and notes what it
// won in $WS/won.
const tmpRacer = `room=$(dirname "$TMPDIR"); i=0
mkdir "$TMPDIR/locked" && touch "$TMPDIR/locked/f" && chmod 0 "$TMPDIR/locked"
while [ ! -e "$WS/stop" ]; do
  i=$((i+1))
  mv "$room/tmp" "$room/tmp.old$i" 2>/dev/null && echo "moved $i" >>"$WS/won"
  ln -sT "$DATA" "$room/tmp.link$i" 2>/dev/null && echo "linked $i" >>"$WS/won"
  ln -s "$DATA" "$TMPDIR/data$i" 2>/dev/null
  echo planted >"$TMPDIR/planted$i" 2>/dev/null
  echo tried
done`

// tmpNext is the next start's agent: what its TMPDIR holds and is, and
// what it reaches of the data dir through it.
const tmpNext = `echo "listing:$(ls -A "$TMPDIR" | tr '\n' ' ')"
[ -L "$TMPDIR" ] && echo "TMPDIR is a link"
cat "$TMPDIR/token" "$DATA/token" 2>/dev/null
echo written >"$TMPDIR/../written" 2>/dev/null && echo "wrote beside TMPDIR"
true`

// tmpRace plays the TMPDIR race of a survivor against a room's next
// starts under base (a data dir base/data with the server's 0600 token
// and the room's folder in it, and the room's workspace base/ws), the
// agents running as u (nil: the launcher's user). It returns what went
// wrong, nil when the attack failed every time.
func tmpRace(ctx context.Context, base string, u *User) error {
	c, err := New(Options{Mode: ModeLandlock})
	if err != nil {
		return err
	}
	data, ws := filepath.Join(base, "data"), filepath.Join(base, "ws")
	room := filepath.Join(data, "rooms", "r")
	home := filepath.Join(room, "home")
	for _, d := range []string{data, filepath.Dir(room), room, home, ws} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	if u != nil {
		for _, d := range []string{ws, home} {
			if err := os.Chown(d, u.UID, u.GID); err != nil {
				return err
			}
		}
	}
	const secret = "the-servers-token"
	token := filepath.Join(data, "token")
	if err := os.WriteFile(token, []byte(secret), 0o600); err != nil {
		return err
	}
	start := func(script string) (*exec.Cmd, *bytes.Buffer, *bufio.Reader, error) {
		r := AgentRoom(ws, home, []string{"sh"}, nil)
		r.User = u
		p, err := c.Policy(r)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("the start's policy: %w", err)
		}
		argv, env, err := p.Wrap([]string{"/bin/sh", "-c", script}, []string{"PATH=/usr/bin:/bin", "WS=" + ws, "DATA=" + data})
		if err != nil {
			return nil, nil, nil, err
		}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env, cmd.Dir = env, ws
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, nil, err
		}
		return cmd, &stderr, bufio.NewReader(out), nil
	}
	racer, racerErr, racerOut, err := start(tmpRacer)
	if err != nil {
		return err
	}
	defer racer.Wait()
	defer racer.Process.Kill()
	// Each start waits for a round of the survivor's after the last
	// start, so that every start races at least one; the survivor never
	// waits for the test.
	rounds := make(chan struct{}, 1)
	go func() {
		for {
			if _, err := racerOut.ReadString('\n'); err != nil {
				close(rounds)
				return
			}
			select {
			case rounds <- struct{}{}:
			default:
			}
		}
	}()
	round := func() error {
		select {
		case _, ok := <-rounds:
			if !ok {
				return errors.New("the survivor ended before the starts did")
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var problems []string
	for i := range tmpRaceRounds {
		if err := round(); err != nil {
			return err
		}
		next, nextErr, nextOut, err := start(tmpNext)
		if err != nil {
			// A start refused (a link found) would hold too, but the
			// survivor can make none: the room's folder is not its.
			return fmt.Errorf("start %d: %w", i, err)
		}
		var out bytes.Buffer
		_, _ = out.ReadFrom(nextOut)
		if err := next.Wait(); err != nil {
			return fmt.Errorf("start %d: %v: %s%s", i, err, out.String(), nextErr)
		}
		got := out.String()
		if got != "listing:\n" {
			problems = append(problems, fmt.Sprintf("start %d's agent saw %q", i, got))
		}
	}
	if err := os.WriteFile(filepath.Join(ws, "stop"), nil, 0o600); err != nil {
		return err
	}
	for range rounds { // to its end
	}
	if err := racer.Wait(); err != nil {
		return fmt.Errorf("the survivor: %v: %s", err, racerErr)
	}
	if won, err := os.ReadFile(filepath.Join(ws, "won")); err == nil {
		problems = append(problems, "the survivor swapped the room's TMPDIR: "+strings.ReplaceAll(string(won), "\n", "; "))
	}
	// Nothing of the data dir changed: the token, its mode, no new file.
	if b, err := os.ReadFile(token); err != nil || string(b) != secret {
		problems = append(problems, fmt.Sprintf("the token: %q %v", b, err))
	}
	if st, err := os.Stat(token); err != nil || st.Mode().Perm() != 0o600 {
		problems = append(problems, fmt.Sprintf("the token's mode: %v", err))
	}
	// With the survivor gone, the next start removes what the earlier
	// ones set aside.
	next, nextErr, nextOut, err := start(tmpNext)
	if err != nil {
		return fmt.Errorf("the last start: %w", err)
	}
	_, _ = io.Copy(io.Discard, nextOut)
	if err := next.Wait(); err != nil {
		return fmt.Errorf("the last start: %v: %s", err, nextErr)
	}
	ents, _ := os.ReadDir(room)
	for _, e := range ents {
		if n := e.Name(); n != "home" && n != "tmp" {
			problems = append(problems, "the room's folder holds "+n)
		}
	}
	if fi, err := os.Lstat(filepath.Join(room, "tmp")); err != nil || !fi.IsDir() {
		problems = append(problems, fmt.Sprintf("the room's TMPDIR is no folder: %v %v", fi, err))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// A process left in the room (a survivor of its agent) races every
// later start for its TMPDIR ("tmp" in the room's folder, emptied and
// made again at each start): it cannot move or replace it (the room's
// folder is not the agent's to write), nothing it plants reaches the next
// agent (whose TMPDIR is empty at its start and a folder, not a link),
// and nothing of the data dir changes. As the launcher's user (root
// here, or any server's user), as a uid of the agent's own (root), and
// under a server run as uid 65534 (no cgroup: the case where survivors
// exist). The repro: ../shared/repro/confine/16 (HOME/tmp before the
// TMPDIR moved beside the home).
func TestLaunch_TmpRaceBySurvivor(t *testing.T) {
	needLandlock(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	t.Run("server's user", func(t *testing.T) {
		if err := tmpRace(ctx, t.TempDir(), nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("agent's uid", func(t *testing.T) {
		needRoot(t)
		if err := tmpRace(ctx, t.TempDir(), &User{UID: agentTestUID, GID: agentTestUID}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("server as uid 65534", func(t *testing.T) {
		needRoot(t)
		const nobody = 65534
		base, err := os.MkdirTemp("", "agenthost-confine-tmprace-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(base) })
		if err := os.Chmod(base, 0o755); err != nil {
			t.Fatal(err)
		}
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		copyExe := filepath.Join(base, "confine.test")
		if err := copyFile(exe, copyExe); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(base, "server")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, copyExe)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), roleEnv + "=tmprace", nonRootDir + "=" + dir}
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the non-root server: %v\n%s", err, out)
		}
		if string(out) != "held\n" {
			t.Fatalf("the non-root server: %s", out)
		}
	})
}

// tmpRaceServer is TestLaunch_TmpRaceBySurvivor's server run as a uid
// other than root.
func tmpRaceServer() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := tmpRace(ctx, os.Getenv(nonRootDir), nil); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("held")
	return 0
}
