package confine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ProbeResult is what a shell run through the launcher saw of its own
// confinement (its /proc/self/status, and two file accesses).
type ProbeResult struct {
	UID, GID                               int
	CapInh, CapPrm, CapEff, CapBnd, CapAmb uint64
	NoNewPrivs                             int
	// Seccomp is the kernel's mode: 0 none, 2 a filter.
	Seccomp int
	// Wrote: the shell wrote its workspace; Denied: it could not read a
	// file beside it.
	Wrote, Denied bool
}

// probeTimeout bounds a probe's shell.
const probeTimeout = 30 * time.Second

// Probe runs a shell through the launcher, confined to a workspace of a
// scratch folder (0700, so that an agent uid's view is exercised) and run
// as u (nil: this process's user), and reports what it saw.
func (c *Confiner) Probe(ctx context.Context, u *User) (ProbeResult, error) {
	if !c.Enforced() {
		return ProbeResult{}, errors.New("confine: agents run unconfined here")
	}
	dir, err := os.MkdirTemp("", "agenthost-probe-")
	if err != nil {
		return ProbeResult{}, err
	}
	defer os.RemoveAll(dir)
	ws, home, other := filepath.Join(dir, "ws"), filepath.Join(dir, "home"), filepath.Join(dir, "other")
	for _, d := range []string{ws, home, other} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return ProbeResult{}, err
		}
		if u != nil && d != other {
			if err := os.Chown(d, u.UID, u.GID); err != nil {
				return ProbeResult{}, err
			}
		}
	}
	const secret = "the other folder's content"
	if err := os.WriteFile(filepath.Join(other, "secret"), []byte(secret), 0o600); err != nil {
		return ProbeResult{}, err
	}
	r := AgentRoom(ws, home, []string{"sh"}, nil)
	r.User = u
	p, err := c.Policy(r)
	if err != nil {
		return ProbeResult{}, err
	}
	script := `echo ok > mine; cat ../other/secret; grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status`
	argv, env, err := p.Wrap([]string{"sh", "-c", script}, []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home})
	if err != nil {
		return ProbeResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = env, ws
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	if ee := (*exec.ExitError)(nil); errors.As(runErr, &ee) && ee.ExitCode() == 126 {
		return ProbeResult{}, fmt.Errorf("the launcher refused: %s", strings.TrimSpace(stderr.String()))
	}
	res := ProbeResult{Denied: !strings.Contains(stdout.String()+stderr.String(), secret), UID: -1, GID: -1, NoNewPrivs: -1, Seccomp: -1}
	if _, err := os.Stat(filepath.Join(ws, "mine")); err == nil {
		res.Wrote = true
	}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(value)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.Atoi(f[0])
		bits, _ := strconv.ParseUint(f[0], 16, 64)
		switch name {
		case "Uid":
			res.UID = n
		case "Gid":
			res.GID = n
		case "CapInh":
			res.CapInh = bits
		case "CapPrm":
			res.CapPrm = bits
		case "CapEff":
			res.CapEff = bits
		case "CapBnd":
			res.CapBnd = bits
		case "CapAmb":
			res.CapAmb = bits
		case "NoNewPrivs":
			res.NoNewPrivs = n
		case "Seccomp":
			res.Seccomp = n
		}
	}
	if res.UID < 0 || res.NoNewPrivs < 0 || res.Seccomp < 0 {
		return res, fmt.Errorf("the confined shell's status was not read: %v %s", runErr, strings.TrimSpace(stderr.String()))
	}
	return res, nil
}

// Problems are where r falls short of the confinement a launcher as
// root (root) or not gives: each line a problem.
func (r ProbeResult) Problems(root bool) []string {
	var out []string
	if !r.Wrote {
		out = append(out, "the confined shell could not write its workspace")
	}
	if !r.Denied {
		out = append(out, "the confined shell read a file outside its workspace: the kernel does not enforce Landlock")
	}
	if r.CapInh|r.CapPrm|r.CapEff|r.CapAmb != 0 {
		out = append(out, fmt.Sprintf("the agent holds capabilities (inheritable %x, permitted %x, effective %x, ambient %x)", r.CapInh, r.CapPrm, r.CapEff, r.CapAmb))
	}
	if root && r.CapBnd != 0 {
		out = append(out, fmt.Sprintf("the agent's bounding set is %x, not empty", r.CapBnd))
	}
	if r.NoNewPrivs != 1 {
		out = append(out, "no_new_privs is not set")
	}
	if seccompSupported && r.Seccomp != 2 {
		out = append(out, fmt.Sprintf("seccomp mode %d, not 2 (a filter)", r.Seccomp))
	}
	return out
}

// String is r in a line.
func (r ProbeResult) String() string {
	sec := map[int]string{0: "0 (none)", 1: "1 (strict)", 2: "2 (filter)"}[r.Seccomp]
	return fmt.Sprintf("uid %d gid %d; capabilities effective %x permitted %x inheritable %x ambient %x bounding %x; NoNewPrivs %d; Seccomp %s",
		r.UID, r.GID, r.CapEff, r.CapPrm, r.CapInh, r.CapAmb, r.CapBnd, r.NoNewPrivs, sec)
}
