package client

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Status is a lease's status document (docs/PROTOCOL.md §4.1), as a read of
// its file returns it. A value type: safe to share once returned.
type Status struct {
	// Resource is the lease name relative to the mount; LeaseID its id.
	Resource, LeaseID string
	// State is "active", "complete" or "abandoned"; Mode "token" or
	// "handle".
	State, Mode string
	// Generation is the fencing token (§1).
	Generation uint64
	// HolderUID and HolderPID name the holder (PID 0 when unknown).
	HolderUID, HolderPID int
	// Host is the host name of the daemon that granted the lease.
	Host string
	// StartedAt and HeartbeatAt: reservation and last renew. ExpiresAt:
	// when an active token lease expires without a renew (zero for handle
	// leases). KeepAliveUntil: the local end of a handle lease an etcd
	// store keeps alive (§8a), zero otherwise.
	StartedAt, HeartbeatAt, ExpiresAt, KeepAliveUntil time.Time
	// Waiters is the number of blocked flock waiters on the name (§6).
	Waiters int
	// Fields holds every key of the document, strings unquoted, times and
	// numbers as written: annotations (client, path, …), takeover requests
	// and keys a newer daemon adds.
	Fields map[string]string
}

// Duration is the lease duration of an active token lease: ExpiresAt minus
// HeartbeatAt; 0 for other leases.
func (s *Status) Duration() time.Duration {
	if s.ExpiresAt.IsZero() || s.HeartbeatAt.IsZero() {
		return 0
	}
	return s.ExpiresAt.Sub(s.HeartbeatAt)
}

// errNoStatus is the error of a read that returned no status document: a
// token (the first read after reserving) or something that is not a lease
// file.
var errNoStatus = errors.New("no status document")

// parseStatus parses a status document: one `key = value` per line, string
// values TOML basic strings (whose escapes Go's strconv.Unquote reads),
// times RFC 3339 in UTC. Lines of another shape are skipped. Errors:
// errNoStatus without a lease_id; a malformed generation.
func parseStatus(doc []byte) (*Status, error) {
	fields := make(map[string]string)
	for line := range bytes.SplitSeq(doc, []byte("\n")) {
		k, v, ok := strings.Cut(string(line), " = ")
		if !ok {
			continue
		}
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		}
		fields[k] = v
	}
	return statusOfFields(fields)
}

// statusOfFields returns the Status of a status document's fields, strings
// unquoted. Errors: errNoStatus without a lease_id; a malformed generation.
func statusOfFields(f map[string]string) (*Status, error) {
	st := &Status{Fields: f}
	if f["lease_id"] == "" {
		return nil, errNoStatus
	}
	st.Resource, st.LeaseID, st.State, st.Mode, st.Host = f["resource"], f["lease_id"], f["status"], f["mode"], f["host"]
	var err error
	if st.Generation, err = strconv.ParseUint(f["generation"], 10, 64); err != nil {
		return nil, fmt.Errorf("status document of %s: generation %q: %w", st.Resource, f["generation"], err)
	}
	st.HolderUID, _ = strconv.Atoi(f["holder_uid"])
	st.HolderPID, _ = strconv.Atoi(f["holder_pid"])
	st.Waiters, _ = strconv.Atoi(f["waiters"])
	for _, t := range []struct {
		key string
		to  *time.Time
	}{
		{"started_at", &st.StartedAt}, {"heartbeat_at", &st.HeartbeatAt},
		{"expires_at", &st.ExpiresAt}, {"keepalive_until", &st.KeepAliveUntil},
	} {
		*t.to, _ = time.Parse(time.RFC3339Nano, f[t.key])
	}
	return st, nil
}

// statusBuf bounds a status document read: the daemon's documents stay
// far below it (annotations are at most 1 KiB each, §4.2).
const statusBuf = 64 << 10

// readStatus reads the status document through fd with one pread at
// offset 0. Errors: the errno of the read (ESTALE once the lease ended,
// ENOTCONN once its daemon is gone), errNoStatus.
func readStatus(fd int) (*Status, error) {
	buf := make([]byte, statusBuf)
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return nil, err
	}
	return parseStatus(buf[:n])
}

// xattrPrefix names the status document's fields as extended attributes
// (docs/PROTOCOL.md §3: user.lease.<key>, never the token).
const xattrPrefix = "user.lease."

// readStatusAttrs reads the status document of the lease behind fd from
// its extended attributes, which never hold the token. A read at offset 0
// by the holder's uid or root takes an unread token (docs/PROTOCOL.md §3,
// "Choices"): this is how the client reads a lease that may be another's,
// so that the holder still gets its token. Errors: the errno of
// flistxattr or fgetxattr (ESTALE once the lease ended, ENOTCONN once its
// daemon is gone), errNoStatus.
func readStatusAttrs(fd int) (*Status, error) {
	buf := make([]byte, statusBuf)
	n, err := retryEINTR(func() (int, error) { return unix.Flistxattr(fd, buf) })
	if err != nil {
		return nil, err
	}
	fields := make(map[string]string)
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		key, ok := strings.CutPrefix(name, xattrPrefix)
		if !ok {
			continue
		}
		m, err := retryEINTR(func() (int, error) { return unix.Fgetxattr(fd, name, buf) })
		if errors.Is(err, unix.ENODATA) {
			continue // the field left the document meanwhile (waiters = 0)
		}
		if err != nil {
			return nil, err
		}
		fields[key] = string(buf[:m])
	}
	return statusOfFields(fields)
}

// retryEINTR calls fn until it does not fail with EINTR (a signal to this
// process, Go's own SIGURG included, interrupts a FUSE call).
func retryEINTR(fn func() (int, error)) (int, error) {
	for {
		n, err := fn()
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// statusOf reads the status document of path through a new read-only
// open, from its extended attributes ([readStatusAttrs]: never another
// holder's token); nil when the name has no live lease or cannot be read.
func statusOf(path string) *Status {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	st, err := readStatusAttrs(fd)
	if err != nil {
		return nil
	}
	return st
}

// heldError returns the *HeldError of resource at path for errno, with the
// holder read from the status document when it can be.
func heldError(path, resource string, errno error) error {
	e := &HeldError{Resource: resource, Err: errno}
	if st := statusOf(path); st != nil {
		e.UID, e.PID, e.Host, e.Since = st.HolderUID, st.HolderPID, st.Host, st.StartedAt
	}
	return e
}

// fuseSuperMagic is statfs(2)'s f_type of every FUSE mount.
const fuseSuperMagic = 0x65735546

// checkMount returns ErrNotMounted unless mount is a directory on a FUSE
// file system, and the statfs error when it cannot be checked. It does
// not tell leasefs from other FUSE file systems: a wrong one fails the
// first operation instead.
func checkMount(mount string) error {
	var sfs unix.Statfs_t
	if err := unix.Statfs(mount, &sfs); err != nil {
		return &os.PathError{Op: "statfs", Path: mount, Err: err}
	}
	if sfs.Type != fuseSuperMagic {
		return fmt.Errorf("%s: %w", mount, ErrNotMounted)
	}
	return nil
}

// isDir reports whether path is a directory.
func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// Stat reads the status document of name under mount through a new
// read-only open, from its extended attributes (docs/PROTOCOL.md §3,
// user.lease.<key>): never the token, so that a holder that has not read
// its token yet still gets it. Errors: the errno of the open, flistxattr
// or fgetxattr in an *os.PathError (ENOENT when the name has no live
// lease); ErrNotMounted.
func Stat(mount, name string) (*Status, error) {
	path, err := leasePath(mount, name)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	st, err := readStatusAttrs(fd)
	if err != nil {
		return nil, &os.PathError{Op: "getxattr", Path: path, Err: err}
	}
	return st, nil
}
