package main

import (
	"strings"
	"testing"
)

// crashingAgent answers the start handshake, acknowledges the prompt,
// starts a background child that inherits stdout, and exits 7.
const crashingAgent = `while read -r line; do
  id=$(printf %s "$line" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
  case "$line" in
  *get_state*) printf '{"id":"%s","type":"response","command":"get_state","success":true,"data":{}}\n' "$id" ;;
  *prompt*)
    printf '{"id":"%s","type":"response","command":"prompt","success":true}\n{"type":"agent_start"}\n' "$id"
    /bin/sleep 3997 &
    echo "fatal: model exploded" >&2
    exit 7 ;;
  esac
done`

// A crash while a descendant holds the agent's stdout is reported as the
// crash (exit status and stderr), not as a timeout.
func TestPrompt_CrashWithDescendantHoldingStdout(t *testing.T) {
	_, errs, code := runCLI(t, "prompt", "--timeout", "60s", "x", "--", "/bin/sh", "-c", crashingAgent)
	if code != 1 || !strings.Contains(errs, "exit status 7") || !strings.Contains(errs, "model exploded") {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	if pids := pgrep(t, "/bin/sleep 3997"); len(pids) > 0 {
		t.Fatalf("left behind: %v", pids)
	}
}
