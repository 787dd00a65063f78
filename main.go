// Command leasefs mounts exclusive writer leases as files (see README.md and
// docs/PROTOCOL.md §8 for the commands; the commands are package
// internal/cli).
//
// Exit codes: 0 success; 1 failure; 2 usage error; 3 the state directory is
// served by another daemon (the message names it); 5 "leasefs status"
// cannot reach the daemon's etcd cluster. "leasefs lock" adds its own (the
// command's status, 4, 66, 69, 126, 127: docs/PROTOCOL.md §8).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/leasefs/leasefs/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
