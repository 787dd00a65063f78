// Command bench measures leasefs against its floors, its ceiling and two
// well-known lock services, and writes the results as BENCHMARKS.md and a
// throughput chart.
//
// Usage, from the repository root:
//
//	cd bench && go run . [-quick] [-only REGEX] [-out DIR] [-duration D] [-warmup D] [-profile DIR [-trace]]
//
// It builds the daemon from the current tree, mounts it on a temporary
// directory and drives it with real system calls from 1, 4, 16 and 64
// clients (goroutines, each on its own OS thread). The same cycles run
// against an in-memory go-fuse filesystem (the FUSE ceiling), against the
// same filesystem committing every change with a group-committed fdatasync
// (the durable ceiling), against the durable-write floors (pwrite +
// fdatasync; temporary file, fsync, rename, directory fsync), against embedded
// etcd (concurrency.Mutex) and against two private redis-server instances
// (appendfsync always and everysec). Scale rows plant 100 to 100,000 live
// leases in a fresh state directory and time the daemon's start, its
// memory, a listing and a reservation among them. A last row SIGKILLs a
// handle-lease holder and times how long its blocked successor waits.
//
// Sections
//
//   - Rows: each row is a workload; each cell runs for -warmup, then for
//     -duration while every operation's latency is recorded. ops/s counts
//     completed cycles of all clients over the measured window.
//   - Targets: ratios measured in the same run, with PASS or MISS.
//   - Output: the table on stdout, progress on stderr, BENCHMARKS.md in
//     -out and throughput.svg in -out/bench. -out defaults to the module
//     root for a full run; a run with -only or -quick writes neither file
//     unless -out is given, so that it cannot replace the record of a full
//     run.
//   - Profiles: with -profile DIR, the daemon's CPU profile of every cell of
//     rows 1a–1c (DIR/1a-16clients.cpu.pb.gz, …) and its block and mutex
//     profiles over the leasefs rows (DIR/leasefs.block.pb.gz,
//     DIR/leasefs.mutex.pb.gz), for go tool pprof; with -trace as well,
//     an execution trace of each of those cells instead of its CPU profile
//     (DIR/1a-1clients.trace, for go tool trace).
//
// Everything the command starts (the daemon, the FUSE ceiling, redis-server,
// etcd) is stopped and every mount is detached before it exits, on error and
// on Ctrl-C too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role, os.Args[1:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0) // the flag package printed the usage
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run parses args, runs the selected rows and writes the report. Progress
// goes to stderr, the table and the targets to stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	b, err := newBench(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer b.close()
	if err := b.runAll(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	rep := b.report()
	if _, err := io.WriteString(stdout, rep.text()); err != nil {
		return err
	}
	if cfg.out == "" {
		fmt.Fprintln(stderr, "bench: a partial run (-only or -quick) writes no BENCHMARKS.md; pass -out DIR to write one")
		return nil
	}
	return rep.write(cfg.out)
}
