package client

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// Sentinel errors of the package. Test with errors.Is; the errno of the
// system call is wrapped beside them (docs/PROTOCOL.md §9).
var (
	// ErrHeld: the name has another holder. Reserve gets it for EEXIST,
	// TryLock for EWOULDBLOCK. The error is a *HeldError.
	ErrHeld = errors.New("held by another holder")
	// ErrLost: the lease has ended (ESTALE through its descriptor), or a
	// take-back after a daemon restart found the name ended (ENOENT),
	// held by another (EWOULDBLOCK) or another lease, or the daemon was not
	// back within the reconnect bound.
	ErrLost = errors.New("lease lost")
	// ErrNoNamespace: the name's namespace (its parent directory) does not
	// exist (ENOENT of the create). Create it with os.Mkdir.
	ErrNoNamespace = errors.New("namespace does not exist")
	// ErrNotMounted: the directory given as the mount is not a FUSE mount
	// (statfs(2) f_type), so nothing was created in it.
	ErrNotMounted = errors.New("not a leasefs mount")
)

// HeldError is the error of a reserve or try-lock of a name that another
// holder has: errors.Is(err, ErrHeld) holds, and the errno (EEXIST or
// EWOULDBLOCK) is wrapped. The holder fields are zero when the status
// document could not be read (the lease ended meanwhile). A value type;
// safe to share once returned.
type HeldError struct {
	// Resource is the lease name relative to the mount, e.g. "ci/deploy".
	Resource string
	// UID and PID are holder_uid and holder_pid of the status document
	// (PID 0 when unknown; informational only, docs/PROTOCOL.md §4.1).
	UID, PID int
	// Host is the host name of the daemon that granted the lease.
	Host string
	// Since is when the lease started (started_at).
	Since time.Time
	// Err is the errno of the refused call.
	Err error
}

// Error names the holder as "leasefs ls" does: uid, pid, host and since.
func (e *HeldError) Error() string {
	if e.Since.IsZero() {
		return fmt.Sprintf("%s is held", e.Resource)
	}
	return fmt.Sprintf("%s is held by uid %d pid %d on %s since %s", e.Resource, e.UID, e.PID, e.Host,
		e.Since.UTC().Format(time.RFC3339))
}

// Unwrap returns ErrHeld and the errno.
func (e *HeldError) Unwrap() []error { return []error{ErrHeld, e.Err} }

// NamespaceError is the error of a reserve or lock whose namespace is
// missing: errors.Is(err, ErrNoNamespace) holds, and ENOENT is wrapped. A
// value type; safe to share once returned.
type NamespaceError struct {
	// Namespace is the missing directory relative to the mount, e.g. "ci";
	// Dir is its path under the mount.
	Namespace, Dir string
	// Err is the errno of the create (ENOENT).
	Err error
}

// Error says which namespace is missing and how to create it.
func (e *NamespaceError) Error() string {
	return fmt.Sprintf("namespace %s does not exist: mkdir %s", e.Namespace, e.Dir)
}

// Unwrap returns ErrNoNamespace and the errno.
func (e *NamespaceError) Unwrap() []error { return []error{ErrNoNamespace, e.Err} }

// lostError wraps err (an errno or a description) as ErrLost for the lease
// of resource.
func lostError(resource string, err error) error {
	return fmt.Errorf("lease on %s: %w: %w", resource, ErrLost, err)
}

// namespaceOf returns the namespace of resource ("ci" of "ci/deploy"), ""
// at the mount's root.
func namespaceOf(resource string) string {
	if i := strings.LastIndexByte(resource, '/'); i >= 0 {
		return resource[:i]
	}
	return ""
}

// missingNamespace returns a *NamespaceError when the create of resource
// under mount failed with ENOENT because the first missing directory on
// the way is absent, nil when the namespace exists (the ENOENT had another
// cause, such as a lease that ended between lookup and open).
func missingNamespace(mount, resource string, errno error) error {
	ns := namespaceOf(resource)
	if ns == "" {
		return nil
	}
	parts := strings.Split(ns, "/")
	for i := range parts {
		sub := strings.Join(parts[:i+1], "/")
		dir := filepath.Join(mount, sub)
		if !isDir(dir) {
			return &NamespaceError{Namespace: sub, Dir: dir, Err: errno}
		}
	}
	return nil
}
