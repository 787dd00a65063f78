// Package refusal sorts the refused operations of a leasefs daemon into
// expected outcomes, misuse and failures, and limits how many log lines
// misuse writes per caller (docs/PROTOCOL.md §8b, "Logs" and "Metrics").
//
// A [Conflict] is what contention looks like from the file protocol: a
// try-lock on a held name, an O_EXCL create of one. Clients poll with them
// (python3-filelock retries a non-blocking flock twenty times a second),
// so the daemon logs them at DEBUG and counts them apart from refusals. A
// [Failure] is the store's, not the caller's: a change it could not make
// durable; every one is a warning, as each is a change the caller lost. Any
// other refusal is [Misuse] (EACCES, EPERM, EINVAL, EDQUOT, ESTALE, ENOLCK,
// …): a warning, at most [DefaultBurst] lines at once and
// [DefaultPerSecond] a second per caller uid ([Limiter]), the caller's next
// line counting those left out, so that a caller cannot flood the log.
//
// The package knows nothing of FUSE, slog or Prometheus: fusefs decides a
// line's level with it, the metrics package the counter.
package refusal

import "syscall"

// Kind is the class of a refusal, decided by its errno ([Classify]).
type Kind int

// The kinds of refusals.
const (
	// Misuse is a refusal the caller brought on itself: a wrong token,
	// another uid's lease, a malformed payload, an ended lease, …
	Misuse Kind = iota
	// Conflict is the expected outcome of contention for a name.
	Conflict
	// Failure is a change the store could not make (docs/PROTOCOL.md §9:
	// EIO, ENOSPC, EROFS; ENOTCONN from a daemon whose store is closed).
	Failure
)

// Classify returns the kind of a refusal with errno (docs/PROTOCOL.md
// §9). Conflicts are EAGAIN, which is EWOULDBLOCK on Linux (a non-blocking
// flock or F_SETLK on a name another holds; any create or lock while the
// daemon hands over to another), EEXIST (an O_EXCL create or a mkdir of a
// name that exists) and EINTR (a blocking lock whose wait for another
// holder a signal interrupted, as flock -w and timeout(1) do). Failures
// are EIO, ENOSPC, EROFS and ENOTCONN. Every other errno is misuse.
func Classify(errno syscall.Errno) Kind {
	switch errno {
	case syscall.EAGAIN, syscall.EEXIST, syscall.EINTR:
		return Conflict
	case syscall.EIO, syscall.ENOSPC, syscall.EROFS, syscall.ENOTCONN:
		return Failure
	}
	return Misuse
}
