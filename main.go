// Command leasefs mounts exclusive writer leases as files (see README.md and
// docs/PROTOCOL.md §8 for the commands).
//
// Exit codes: 0 success; 1 failure; 2 usage error; 3 the state directory is
// served by another daemon (the message names it). "leasefs lock" adds its
// own (the command's status, 4, 66, 69, 126, 127: docs/PROTOCOL.md §8).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
