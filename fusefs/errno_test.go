package fusefs

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/leasefs/leasefs/leasecore"
)

func TestToErrno(t *testing.T) {
	held := &leasecore.LeaseHeldError{Holder: leasecore.Lease{ID: "lease-x", Resource: "a"}}
	persist := func(err error) error {
		return &leasecore.PersistError{Op: "write", Path: "/state/writer-leases/x.toml", Err: err}
	}
	wrap := func(err error) error { return fmt.Errorf("leasecore: lease %s: %w", "lease-x", err) }
	tests := []struct {
		name string
		err  error
		want syscall.Errno
	}{
		{"nil", nil, 0},
		{"held error", held, syscall.EEXIST},
		{"held error wrapped", wrap(held), syscall.EEXIST},
		{"held sentinel", leasecore.ErrHeld, syscall.EEXIST},
		{"exists", wrap(leasecore.ErrExists), syscall.EEXIST},
		{"not found", wrap(leasecore.ErrNotFound), syscall.ENOENT},
		{"no namespace", wrap(leasecore.ErrNoNamespace), syscall.ENOENT},
		{"token mismatch", wrap(leasecore.ErrTokenMismatch), syscall.EACCES},
		{"inactive", wrap(leasecore.ErrInactive), syscall.ESTALE},
		{"name too long", wrap(leasecore.ErrNameTooLong), syscall.ENAMETOOLONG},
		{"invalid name", wrap(leasecore.ErrInvalidName), syscall.EINVAL},
		{"invalid id", wrap(leasecore.ErrInvalidID), syscall.EINVAL},
		{"invalid argument", wrap(leasecore.ErrInvalidArgument), syscall.EINVAL},
		{"quota", wrap(leasecore.ErrQuota), syscall.EDQUOT},
		{"not empty", wrap(leasecore.ErrNotEmpty), syscall.ENOTEMPTY},
		{"is namespace", wrap(leasecore.ErrIsNamespace), syscall.EISDIR},
		{"read-only", leasecore.ErrReadOnly, syscall.EROFS},
		{"closed (daemon handed over or stopping)", leasecore.ErrClosed, syscall.ENOTCONN},
		{"persist ENOSPC", persist(syscall.ENOSPC), syscall.ENOSPC},
		{"persist ENOSPC wrapped", wrap(persist(fmt.Errorf("sync: %w", syscall.ENOSPC))), syscall.ENOSPC},
		// A full disk quota is "no space" to the caller: EDQUOT is kept
		// for the per-uid lease quota of docs/PROTOCOL.md §7.
		{"persist EDQUOT", persist(syscall.EDQUOT), syscall.ENOSPC},
		{"persist EIO", persist(syscall.EIO), syscall.EIO},
		{"persist EROFS", persist(syscall.EROFS), syscall.EIO},
		{"persist other", persist(errors.New("disk on fire")), syscall.EIO},
		{"unknown", errors.New("something else"), syscall.EIO},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := toErrno(tt.err); got != tt.want {
				t.Errorf("toErrno(%v) = %v (%d), want %v (%d)", tt.err, got, got, tt.want, tt.want)
			}
		})
	}
}

// TestToErrnoNeverZeroForError guards the contract that a failed store call
// never reaches the kernel as success.
func TestToErrnoNeverZeroForError(t *testing.T) {
	for _, err := range []error{
		errors.New("x"),
		&leasecore.PersistError{},
		&leasecore.LeaseHeldError{},
		fmt.Errorf("%w", leasecore.ErrClosed),
	} {
		if toErrno(err) == 0 {
			t.Errorf("toErrno(%v) = 0", err)
		}
	}
}

func TestErrnoName(t *testing.T) {
	for _, e := range []syscall.Errno{
		syscall.EEXIST, syscall.EACCES, syscall.EPERM, syscall.ESTALE, syscall.EINVAL,
		syscall.ENAMETOOLONG, syscall.EFBIG, syscall.ENOTEMPTY, syscall.EDQUOT,
		syscall.ENOENT, syscall.ENOSPC, syscall.EIO,
	} {
		got := errnoName(e)
		if len(got) < 3 || got[0] != 'E' {
			t.Errorf("errnoName(%d) = %q, want a symbolic name", e, got)
		}
	}
	if got := errnoName(syscall.EACCES); got != "EACCES" {
		t.Errorf("errnoName(EACCES) = %q", got)
	}
	if got := errnoName(syscall.ENODATA); got == "" {
		t.Error("errnoName(ENODATA) is empty")
	}
}
