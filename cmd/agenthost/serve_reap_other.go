//go:build !linux

package main

import (
	"context"
	"log/slog"
)

// Elsewhere the server is no subreaper: a dead daemon's processes are
// not its children.
func reapDeadChild(context.Context, int) {}

type daemonTree struct{}

func newDaemonTree(int) *daemonTree { return nil }

func (*daemonTree) collect() int { return 0 }

func (*daemonTree) follow(context.Context, *slog.Logger) {}
