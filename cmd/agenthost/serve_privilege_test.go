package main

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/roomtest"
)

// statusCommand prints what a room's tool holds: its /proc/self/status
// lines of credentials, capabilities, no_new_privs and seccomp, then id,
// then the owners of the processes its /proc shows.
const statusCommand = `grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; id; ` +
	`echo "procs: $(stat -c %u /proc/[0-9]* 2>/dev/null | sort -u | tr '\n' ' ')"`

// TestServe_AgentsHoldNoPrivilege: a server run as root, with agents on
// uids of their own (the default range) and the built-in model: the
// tools of two omp rooms and one pi room hold no capability (effective,
// permitted, inheritable, ambient, bounding), run with no_new_privs and a
// seccomp filter, and as uids that are neither root, nor the server's,
// nor another room's (gid the same, no other group), and whose /proc
// shows none but their own uid's processes.
func TestServe_AgentsHoldNoPrivilege(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("agents get uids of their own and an empty bounding set only under a server run as root; this test runs as uid " + strconv.Itoa(os.Geteuid()))
	}
	if confine.KernelABI() == 0 {
		t.Skip("the kernel has no Landlock: agents run unconfined here")
	}
	data := t.TempDir()
	url, token, _ := startServe(t, "--data", data, "--approval-mode", "yolo", "--confine", "landlock")
	if code, body := call(t, "PUT", url+"v1/rooms/p/config", token, `{"agent":"pi"}`); code != 200 {
		t.Fatalf("room p on pi: %d %s", code, body)
	}
	body, _ := json.Marshal(map[string]string{"text": "Status: " + roomtest.BashCall(statusCommand)})
	rooms := []string{"a", "b", "p"} // omp, omp, pi
	for _, r := range rooms {
		if code, b := call(t, "POST", url+"v1/rooms/"+r+"/messages", token, string(body)); code != 202 {
			t.Fatalf("post to %s: %d %s", r, code, b)
		}
	}
	seen := map[int]string{} // uid -> room
	for _, r := range rooms {
		st := toolStatus(t, url, token, r)
		uid, gid := st.ids("Uid"), st.ids("Gid")
		if len(uid) != 4 || len(gid) != 4 {
			t.Fatalf("room %s: Uid %v, Gid %v in\n%s", r, uid, gid, st.out)
		}
		for i := range 4 { // real, effective, saved, filesystem
			if uid[i] != uid[0] || gid[i] != uid[0] {
				t.Fatalf("room %s: Uid %v, Gid %v: want one uid, its gid the same", r, uid, gid)
			}
		}
		if uid[0] == 0 || uid[0] == os.Geteuid() {
			t.Fatalf("room %s's tool runs as uid %d (the server's is %d)", r, uid[0], os.Geteuid())
		}
		if other, dup := seen[uid[0]]; dup {
			t.Fatalf("rooms %s and %s run as the same uid %d", other, r, uid[0])
		}
		seen[uid[0]] = r
		for _, c := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			if v := st.field(c); v != "0000000000000000" {
				t.Errorf("room %s: %s %q, want none", r, c, v)
			}
		}
		if v := st.field("NoNewPrivs"); v != "1" {
			t.Errorf("room %s: NoNewPrivs %q", r, v)
		}
		if v := st.field("Seccomp"); v != "2" {
			t.Errorf("room %s: Seccomp %q, want 2 (a filter)", r, v)
		}
		n := strconv.Itoa(uid[0])
		if want := "uid=" + n + " gid=" + n + " groups=" + n; !strings.Contains(st.out, want) {
			t.Errorf("room %s: id says\n%s\nwant %q", r, st.out, want)
		}
		// Its /proc shows its own uid's processes only: neither the
		// server's (root's) nor another room's agent's.
		if m := regexp.MustCompile(`(?m)^procs:(.*)$`).FindStringSubmatch(st.out); m == nil || strings.Join(strings.Fields(m[1]), " ") != n {
			t.Errorf("room %s: its /proc shows processes of uids other than %s:\n%s", r, n, st.out)
		}
	}
}

// toolOutput is what a room's status command printed.
type toolOutput struct{ out string }

// field is the value of a /proc/self/status line.
func (s toolOutput) field(name string) string {
	m := regexp.MustCompile(`(?m)^` + name + `:\s*(\S+)`).FindStringSubmatch(s.out)
	if m == nil {
		return ""
	}
	return m[1]
}

// ids are the numbers of a Uid or Gid line.
func (s toolOutput) ids(name string) []int {
	m := regexp.MustCompile(`(?m)^` + name + `:\s*(.*)$`).FindStringSubmatch(s.out)
	if m == nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(m[1]) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil
		}
		out = append(out, n)
	}
	return out
}

// toolStatus follows room's events to its first turn's end, which must
// settle, and returns the status command's output.
func toolStatus(t *testing.T, url, token, room string) toolOutput {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 180*time.Second)
	defer cancel()
	var out, outcome string
	err := newTestClient(t, url, token).events(ctx, room, 0, true, func(typ string, raw []byte) (bool, error) {
		var ev struct{ Output, Outcome, Reason string }
		_ = json.Unmarshal(raw, &ev)
		switch typ {
		case "tool.ended":
			out = ev.Output
		case "turn.ended":
			outcome = ev.Outcome + " " + ev.Reason
			return true, nil
		}
		return false, nil
	})
	if err != nil || !strings.HasPrefix(outcome, "settled") || !strings.Contains(out, "NoNewPrivs") {
		t.Fatalf("room %s: turn ended %q (%v), tool output:\n%s", room, outcome, err, out)
	}
	return toolOutput{out}
}
