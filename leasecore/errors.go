package leasecore

import (
	"errors"
	"fmt"
)

// Sentinel errors returned by [Store] methods. Callers test them with
// errors.Is; the errors actually returned may wrap them with more context.
var (
	// ErrHeld: the resource has a live lease held by someone else. The
	// returned error is a *[LeaseHeldError] naming the holder.
	ErrHeld = errors.New("leasecore: lease held")
	// ErrNotFound: no lease (or namespace) with that id or name.
	ErrNotFound = errors.New("leasecore: not found")
	// ErrTokenMismatch: the presented token is not the lease's token.
	ErrTokenMismatch = errors.New("leasecore: token mismatch")
	// ErrInactive: the lease has ended (complete or abandoned).
	ErrInactive = errors.New("leasecore: lease inactive")
	// ErrInvalidName: a resource or namespace name breaks the naming rules of
	// docs/PROTOCOL.md §3 (1–255 bytes of valid UTF-8 per component, no NUL or "/").
	ErrInvalidName = errors.New("leasecore: invalid name")
	// ErrNameTooLong: a name component is longer than 255 bytes.
	ErrNameTooLong = errors.New("leasecore: name too long")
	// ErrInvalidID: a lease id is not of the form lease-<base32>.
	ErrInvalidID = errors.New("leasecore: invalid lease id")
	// ErrInvalidArgument: an annotation or status is malformed.
	ErrInvalidArgument = errors.New("leasecore: invalid argument")
	// ErrQuota: the holder uid already holds the maximum number of live
	// leases (docs/PROTOCOL.md §7, --max-leases-per-uid).
	ErrQuota = errors.New("leasecore: lease quota exceeded")
	// ErrNoNamespace: the parent namespace of a resource does not exist.
	ErrNoNamespace = errors.New("leasecore: namespace does not exist")
	// ErrExists: a namespace or lease already occupies that name.
	ErrExists = errors.New("leasecore: name exists")
	// ErrNotEmpty: a namespace still holds live leases or namespaces.
	ErrNotEmpty = errors.New("leasecore: namespace not empty")
	// ErrIsNamespace: the name is a namespace, not a lease.
	ErrIsNamespace = errors.New("leasecore: name is a namespace")
	// ErrReadOnly: the store was opened read-only.
	ErrReadOnly = errors.New("leasecore: store is read-only")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("leasecore: store closed")
	// ErrOutcomeUnknown: the store cannot tell whether a change was
	// applied (a network store timed out; a directory fsync failed after
	// the rename). The next read shows which. Mapped to EIO.
	ErrOutcomeUnknown = errors.New("leasecore: outcome unknown")
)

// LeaseHeldError reports that a resource already has a live lease, and names
// its holder. It matches [ErrHeld] under errors.Is.
type LeaseHeldError struct {
	// Holder is a copy of the live lease.
	Holder Lease
}

// Error names the resource, the lease and its holder uid and pid.
func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("leasecore: %q is held by lease %s (uid %d, pid %d, generation %d)",
		e.Holder.Resource, e.Holder.ID, e.Holder.HolderUID, e.Holder.HolderPID, e.Holder.Generation)
}

// Is reports whether target is [ErrHeld].
func (e *LeaseHeldError) Is(target error) bool { return target == ErrHeld }

// PersistError reports that the store could not make a change durable; the
// change was not applied. It unwraps to the underlying I/O error (for example
// syscall.ENOSPC), so callers can map it to ENOSPC or EIO.
type PersistError struct {
	Op   string // "write", "remove", "sync"
	Path string
	Err  error
}

// Error describes the failed operation and file.
func (e *PersistError) Error() string {
	return fmt.Sprintf("leasecore: %s %s: %v", e.Op, e.Path, e.Err)
}

// Unwrap returns the underlying I/O error.
func (e *PersistError) Unwrap() error { return e.Err }

// Is reports whether target is [ErrOutcomeUnknown] and the change may have
// been applied: the failed step was the fsync of a directory after a
// rename had replaced the record.
func (e *PersistError) Is(target error) bool { return target == ErrOutcomeUnknown && e.Op == "sync" }
