// Package client takes and holds leasefs leases from Go through nothing but
// file I/O on a leasefs mount: the operations of docs/PROTOCOL.md §3, §4.2
// and §6, with the errno of §9 turned into typed errors.
//
// Two kinds of lease:
//
//   - A token lease ([Reserve]) is reserved by an O_EXCL create; its holder
//     renews it within the lease duration (the daemon's --lease-duration)
//     by writing the token, which [Lease.KeepAlive] does in a goroutine, and
//     ends it with [Lease.Complete] or [Lease.Abandon]. It outlives the
//     process unless renewals stop.
//   - A handle lease ([Lock], [TryLock]) is a flock(2) on the lease file: it
//     lives exactly as long as its open file, and the kernel ends it when the
//     process dies, SIGKILL included.
//
// Both carry a generation ([Lease.Generation], [HandleLease.Generation]):
// the fencing token, strictly larger for every newer lease of the store
// (docs/PROTOCOL.md §1). Pass it to whatever the holder writes, so that a
// stale holder can be refused.
//
// Both survive a restart of the daemon, as "leasefs lock" does
// (docs/PROTOCOL.md §2, "Handle leases across restarts", and §8): while the
// mount does not answer, the keep-alive and [HandleLease.Check] wait for a
// leasefs mount to answer on the mountpoint again and take the lease back
// through a new open file, within the bounds of [WithReconnectTimeout].
//
// # Errors
//
// Every error wraps the errno of the system call that failed, so that
// errors.Is(err, syscall.EACCES) holds where the protocol says EACCES; the
// outcomes a caller decides on are sentinels besides: [ErrHeld] (the name
// has another holder: EEXIST of a reserve, EWOULDBLOCK of a try-lock; the
// error is a [*HeldError] naming the holder), [ErrLost] (the lease has
// ended or another holds the name now: ESTALE, or a take-back that found
// the name ended or held by another), [ErrNoNamespace] (the parent
// directory of the name is missing: ENOENT of the create) and
// [ErrNotMounted] (the directory is not a leasefs mount).
//
// # Waiting
//
// A blocking [Lock] waits in the kernel, first come first served. Go
// installs its signal handlers with SA_RESTART, so a flock(2) interrupted by
// a signal restarts instead of returning, and no signal to the waiting
// thread can end the wait. Lock therefore waits in a child process: the
// program's own executable (/proc/self/exe) started again with
// LEASEFS_CLIENT_FLOCK set, which shares the open file and takes the flock
// for it. Cancelling the context kills the child, and the kernel abandons
// its request; the lock, once taken, belongs to the shared open file. The
// package's init function serves that child: it does the flock and exits
// before main runs (the init functions of packages that this one does not
// precede in the import graph may run before it, so keep them free of side
// effects that must not happen twice). A program that cannot be started again (a deleted
// executable) gets the error of the start from a Lock that has to wait.
package client
