// Package roomclaims holds, in its tests, the one table of room claims that runs on both
// transports against the real agents (omp over its RPC mode; omp, claude-agent-acp, codex-acp and
// copilot over ACP), and generates the support matrix (docs/support-matrix.md) from that table.
//
// Run the table with `go test ./internal/roomclaims`; regenerate the matrix after changing the
// table with `go test ./internal/roomclaims -run Matrix -update`.
package roomclaims
