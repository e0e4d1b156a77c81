package confine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
)

// init makes any program that imports this package the launcher when it
// is started as one, as soon as this package is initialised: before the
// packages initialised after it (in agenthost: the store, NATS, metrics,
// the rooms), which a launcher never uses. Reaching main took the
// agenthost binary about 30 ms, paid before every confined agent starts;
// the launcher now runs about 11 ms in.
func init() { Launch() }

// Launch is the launcher: when this program was started as one
// (PROGRAM LauncherArg -- COMMAND ARGS... with the policy in PolicyEnv) it
// restricts itself and executes COMMAND, never returning; otherwise it
// returns at once. This package's init calls it; main and the TestMain
// of a test binary that starts confined agents (the launcher is then the
// test binary) call it first as well, so a launcher never gets further
// even if the package's place in initialisation changes. A launcher that
// cannot restrict itself exits 126 and says why on stderr: the agent never
// runs unconfined by mistake.
func Launch() {
	if len(os.Args) < 2 || os.Args[1] != LauncherArg {
		return
	}
	// Credentials, capabilities, securebits, no_new_privs, the seccomp
	// filter, the Landlock domain, the mount namespace and the working
	// folder are each a thread's: the launcher sets them all on this one
	// thread and executes the agent from it (execve keeps the caller's).
	// It never unlocks: the thread is the agent's.
	runtime.LockOSThread()
	err := launch(os.Args[2:])
	fmt.Fprintf(os.Stderr, "agenthost %s: %v\n", LauncherArg, err)
	os.Exit(126)
}

// launch applies the policy and executes argv; it returns only on failure.
func launch(args []string) error {
	if len(args) < 2 || args[0] != "--" {
		return errors.New("usage: " + LauncherArg + " -- COMMAND ARGS... (with the policy in " + PolicyEnv + ")")
	}
	argv := args[1:]
	raw, ok := os.LookupEnv(PolicyEnv)
	if !ok {
		return errors.New("no policy in " + PolicyEnv)
	}
	var p Policy
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		return fmt.Errorf("the policy: %w", err)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, PolicyEnv+"=") })
	return start(&p, argv, env)
}
