package fusefs

import (
	"errors"
	"syscall"

	"github.com/leasefs/leasefs/leasecore"
)

// errDraining refuses new leases while the daemon hands over to another
// (see [FS.Drain]); it maps to EAGAIN.
var errDraining = errors.New("fusefs: daemon is handing over")

// toErrno maps a store error to the errno of docs/PROTOCOL.md §9. A store that cannot
// persist a change answers ENOSPC when the disk is full (or over its quota:
// EDQUOT is reserved for the per-uid lease limit) and EIO otherwise.
func toErrno(err error) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, leasecore.ErrHeld), errors.Is(err, leasecore.ErrExists):
		return syscall.EEXIST
	case errors.Is(err, leasecore.ErrNotFound), errors.Is(err, leasecore.ErrNoNamespace):
		return syscall.ENOENT
	case errors.Is(err, leasecore.ErrTokenMismatch):
		return syscall.EACCES
	case errors.Is(err, leasecore.ErrInactive):
		return syscall.ESTALE
	case errors.Is(err, leasecore.ErrClosed):
		// A closed store belongs to a daemon that has handed over or is
		// stopping. The leases live on (a handle lease while its open
		// file does): the caller gets what it will get once the daemon
		// is gone, not ESTALE, which says the lease ended
		// (docs/PROTOCOL.md §2, §9).
		return syscall.ENOTCONN
	case errors.Is(err, leasecore.ErrNameTooLong):
		return syscall.ENAMETOOLONG
	case errors.Is(err, leasecore.ErrInvalidName), errors.Is(err, leasecore.ErrInvalidID),
		errors.Is(err, leasecore.ErrInvalidArgument):
		return syscall.EINVAL
	case errors.Is(err, leasecore.ErrQuota):
		return syscall.EDQUOT
	case errors.Is(err, leasecore.ErrNotEmpty):
		return syscall.ENOTEMPTY
	case errors.Is(err, leasecore.ErrIsNamespace):
		return syscall.EISDIR
	case errors.Is(err, errDraining):
		return syscall.EAGAIN
	case errors.Is(err, leasecore.ErrReadOnly):
		return syscall.EROFS
	case errors.Is(err, syscall.ENOSPC):
		return syscall.ENOSPC
	case errors.Is(err, syscall.EDQUOT):
		return syscall.ENOSPC
	default:
		return syscall.EIO
	}
}
