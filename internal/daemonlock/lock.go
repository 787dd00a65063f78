package daemonlock

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/procfs"
)

// ErrHeld matches, under errors.Is, every *[HeldError] returned by
// [Acquire]: the lock is held by another process or already by this one.
var ErrHeld = errors.New("daemonlock: lock held")

// Holder identifies the holder of a [Lock]. It is advisory metadata,
// written as JSON next to the lock file; the kernel lock alone decides who
// holds it (docs/PROTOCOL.md §2). The zero value means "unknown holder". A
// Holder is a plain value: copies may be used concurrently.
type Holder struct {
	// PID is the holder's process id; 0 when unknown.
	PID int `json:"pid"`
	// BootID is the holder machine's boot id (see [procfs.BootID]); ""
	// when unknown.
	BootID string `json:"bootId"`
	// Host is the holder's host name (see [procfs.Hostname]).
	Host string `json:"host"`
	// Client is a human label, e.g. "leasefs mount /mnt/leases".
	Client string `json:"client"`
	// Mountpoint is where the holder serves the store, for "leasefs lock"
	// and "leasefs status"; "" when it serves none.
	Mountpoint string `json:"mountpoint,omitempty"`
	// Store names the lease store the holder serves, as its --store flag
	// gives it (e.g. "etcd://10.0.0.1:2379/leasefs"); "" for the file
	// store of the state directory.
	Store string `json:"store,omitempty"`
	// StartedAt is when the holder acquired the lock (wall clock).
	StartedAt time.Time `json:"startedAt"`
}

// CurrentHolder describes this process as a lock holder labelled client:
// its pid, [procfs.BootID], [procfs.Hostname] and the current
// wall-clock time as StartedAt.
func CurrentHolder(client string) Holder {
	return Holder{
		PID:       os.Getpid(),
		BootID:    procfs.BootID(),
		Host:      procfs.Hostname(),
		Client:    client,
		StartedAt: time.Now(),
	}
}

// String describes h for messages, e.g.
// "leasefs mount /mnt/x (pid 123 on host vm, since 2026-11-30T02:00:00Z)".
// Unknown parts (pid 0, empty host, zero StartedAt) are left out; the time is
// printed in UTC, RFC 3339, to the second.
func (h Holder) String() string {
	client := h.Client
	if client == "" {
		client = "unknown holder"
	}
	var parts []string
	if h.PID != 0 {
		p := "pid " + strconv.Itoa(h.PID)
		if h.Host != "" {
			p += " on host " + h.Host
		}
		parts = append(parts, p)
	} else if h.Host != "" {
		parts = append(parts, "on host "+h.Host)
	}
	if !h.StartedAt.IsZero() {
		parts = append(parts, "since "+h.StartedAt.UTC().Format(time.RFC3339))
	}
	if len(parts) == 0 {
		return client
	}
	return client + " (" + strings.Join(parts, ", ") + ")"
}

// Dead reports whether h is certainly gone: it ran on this host (h.Host ==
// [procfs.Hostname]) during this boot (h.BootID == [procfs.BootID],
// both non-empty), its pid is positive, and kill(pid, 0) fails with ESRCH. It
// returns false whenever it cannot be sure: another host or boot, unknown
// fields, or EPERM (the process exists but belongs to another user). A pid
// reused by a newer process makes it return false, and processes in another
// pid namespace of this host may be misjudged; so Dead is a hint for
// diagnostics and for skipping a takeover wait, and the kernel lock remains
// the arbiter.
func (h Holder) Dead() bool {
	if h.PID <= 0 || h.Host == "" || h.BootID == "" {
		return false
	}
	if h.Host != procfs.Hostname() || h.BootID != procfs.BootID() {
		return false
	}
	// kill(2) with signal 0 checks for existence without sending anything.
	return errors.Is(unix.Kill(h.PID, 0), unix.ESRCH)
}

// HeldError reports that a [Lock] is already held, and by whom. It matches
// [ErrHeld] under errors.Is. Like [Holder], it is a plain value.
type HeldError struct {
	// Path is the lock file (absolute).
	Path string
	// Holder is the holder: this process's registration when SameProcess is
	// set, otherwise the advisory metadata beside the lock, or
	// Holder{Client: "another process"} when that cannot be read.
	Holder Holder
	// SameProcess is set when this very process holds the lock.
	SameProcess bool
}

// Error names the lock file and its holder.
func (e *HeldError) Error() string {
	return "daemonlock: " + e.Path + " is held by " + e.Holder.String()
}

// Is reports whether target is [ErrHeld].
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Lock is a held exclusive flock(2) lock on a lock file, such as the
// single-daemon lock <state>/leasefs.lock. Beside it live the advisory holder
// metadata, <path>.json (see [ReadHolder]), and takeover requests,
// <path without ".lock">.takeover (see [WriteTakeoverRequest]).
//
// The kernel releases the lock when the holder closes it ([Lock.Release])
// or dies, so a crashed holder never blocks its successor and nothing expires
// by time (flock(2)). The lock file itself is never removed: the lock belongs
// to its inode, and unlinking it would let a newcomer lock a fresh file while
// an old holder still holds the old one.
//
// A Lock that is dropped without Release stays held until the process
// exits. Its methods are safe for concurrent use.
type Lock struct {
	path   string // absolute, cleaned; also the registry key
	holder Holder

	mu   sync.Mutex
	fd   int
	held bool // false after Release, and in the zero value
}

// heldLocks is the process-wide registry of lock files this process holds or
// is acquiring, keyed by absolute path. The kernel would refuse a second flock
// from this process too, since flock(2) locks taken through separate open(2)
// calls conflict, but it could not tell that the holder is this process, and
// the metadata may not be written yet. The registry answers exactly, without
// touching the file.
var heldLocks = struct {
	sync.Mutex
	m map[string]Holder
}{m: make(map[string]Holder)}

// reserveLock registers holder for path unless path is already registered, in
// which case it returns the registered holder and false.
func reserveLock(path string, holder Holder) (Holder, bool) {
	heldLocks.Lock()
	defer heldLocks.Unlock()
	if existing, ok := heldLocks.m[path]; ok {
		return existing, false
	}
	heldLocks.m[path] = holder
	return holder, true
}

func unregisterLock(path string) {
	heldLocks.Lock()
	defer heldLocks.Unlock()
	delete(heldLocks.m, path)
}

// Acquire takes the exclusive lock on the lock file at path, creating the
// file (mode 0600) if needed; its directory must exist. It does not wait:
// when the lock is held it returns a *[HeldError] matching [ErrHeld], naming
// this process (SameProcess) or the holder found in the metadata at
// path+".json". On success it removes temporary files of the metadata and
// takeover request left by a crash, and records holder as that metadata,
// written atomically and durably (temporary file, fsync, rename, directory
// fsync); a zero holder.StartedAt is set to the current time. Other failures
// are returned wrapped with the path; the lock is then not held.
//
// Within one process, a path names a lock by its absolute, cleaned form;
// spellings that differ through symlinks are still refused, but by the
// kernel: SameProcess is then unset and the holder is read from the metadata.
// The lock is a flock(2) LOCK_EX|LOCK_NB on a close-on-exec descriptor, so
// child processes do not inherit it.
func Acquire(path string, holder Holder) (*Lock, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("daemonlock: acquire lock %s: %w", path, err)
	}
	if holder.StartedAt.IsZero() {
		holder.StartedAt = time.Now()
	}
	if existing, ok := reserveLock(abs, holder); !ok {
		return nil, &HeldError{Path: abs, Holder: existing, SameProcess: true}
	}
	l, err := lockFile(abs, holder)
	if err != nil {
		unregisterLock(abs)
		return nil, err
	}
	return l, nil
}

// lockFile opens and flocks path, then writes the holder metadata. The caller
// has reserved path in the registry.
func lockFile(path string, holder Holder) (*Lock, error) {
	fd, err := openLockFile(path)
	if err != nil {
		return nil, fmt.Errorf("daemonlock: acquire lock %s: open: %w", path, err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			other, ok := ReadHolder(path)
			if !ok {
				other = Holder{Client: "another process"}
			}
			return nil, &HeldError{Path: path, Holder: other}
		}
		return nil, fmt.Errorf("daemonlock: acquire lock %s: flock: %w", path, err)
	}
	// Temporary files of the metadata and of takeover requests left by a
	// crash mid-write are garbage now.
	for _, side := range []string{metadataPath(path), takeoverPath(path)} {
		leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(side), "."+filepath.Base(side)+"*"))
		for _, p := range leftovers {
			_ = os.Remove(p)
		}
	}
	// Stale metadata of a crashed holder must not outlive the acquisition, so
	// a failure to replace it gives the lock up again.
	if err := writeLockJSON(metadataPath(path), holder); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("daemonlock: acquire lock %s: write metadata: %w", path, err)
	}
	return &Lock{path: path, holder: holder, fd: fd, held: true}, nil
}

// openLockFile opens (creating) the lock file at path. O_NONBLOCK: a FIFO
// in its place must not block the open (flock(2) blocks or not by LOCK_NB
// alone); anything but a regular file is refused. Errors: open(2)'s, or
// one that says the file is not a regular file.
func openLockFile(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CREAT|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fd, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			unix.Close(fd)
			return -1, fmt.Errorf("%s is not a regular file", path)
		}
		return fd, nil
	}
}

// Path returns the lock file, absolute and cleaned.
func (l *Lock) Path() string { return l.path }

// Holder returns the holder the lock was acquired for, as recorded in its
// metadata.
func (l *Lock) Holder() Holder { return l.holder }

// Release gives the lock up. While still holding it, it removes the holder
// metadata (<path>.json) and any pending takeover request
// (<path without ".lock">.takeover), which are then known to be this holder's;
// then it unlocks and closes the descriptor, and forgets
// the path in this process. The lock file stays. The lock is released even
// when a removal fails; such failures are returned joined, wrapped with their
// paths. Release on a released, zero or nil Lock does nothing and returns
// nil.
func (l *Lock) Release() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		return nil
	}
	var errs []error
	for _, p := range []string{metadataPath(l.path), takeoverPath(l.path)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("daemonlock: release lock %s: %w", l.path, err))
		}
	}
	// Unlock explicitly before closing: a child forked by another goroutine
	// may still share the open file description until it execs (O_CLOEXEC
	// acts only at exec), and the lock belongs to the description.
	if err := unix.Flock(l.fd, unix.LOCK_UN); err != nil {
		errs = append(errs, fmt.Errorf("daemonlock: release lock %s: unlock: %w", l.path, err))
	}
	// The descriptor is gone after close(2) even when it reports an error.
	if err := unix.Close(l.fd); err != nil {
		errs = append(errs, fmt.Errorf("daemonlock: release lock %s: close: %w", l.path, err))
	}
	l.held = false
	// Unregister last, so that a concurrent acquire in this process sees
	// SameProcess rather than a kernel refusal.
	unregisterLock(l.path)
	return errors.Join(errs...)
}

// metadataPath is where the holder metadata of lock file path lives.
func metadataPath(path string) string { return path + ".json" }

// takeoverPath is where takeover requests for lock file path live.
func takeoverPath(path string) string { return strings.TrimSuffix(path, ".lock") + ".takeover" }

// ReadHolder returns the advisory holder metadata of the lock file at path,
// read from path+".json", and whether it was present and well-formed. The
// metadata describes the last holder that did not release cleanly or the
// current one: it does not prove that the lock is held (check with
// [Acquire], [Held] or [Holder.Dead]).
func ReadHolder(path string) (Holder, bool) {
	var h Holder
	if !readLockJSON(metadataPath(path), &h) {
		return Holder{}, false
	}
	return h, true
}

// Held reports whether some process holds a flock(2) lock on the file at
// path, by finding its device and inode among the FLOCK entries of
// /proc/locks (proc(5)). It takes no lock itself, so probing never disturbs
// the holder. ok is false when path or /proc/locks cannot be read.
func Held(path string) (held, ok bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, false
	}
	data, err := os.ReadFile("/proc/locks")
	if err != nil {
		return false, false
	}
	// "1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF": the device is
	// major:minor in hex, the inode in decimal.
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		f := bytes.Fields(line)
		if len(f) >= 6 && string(f[1]) == "FLOCK" && string(f[5]) == want {
			return true, true
		}
	}
	return false, true
}

// TakeoverRequest asks the holder of a [Lock] to give it up
// (docs/PROTOCOL.md §8b). It is a hint: the holder decides whether to
// release, and the kernel lock remains the arbiter. It is a plain value.
type TakeoverRequest struct {
	// Requester is who asks for the lock.
	Requester Holder `json:"requester"`
	// At is when the request was made (wall clock).
	At time.Time `json:"at"`
	// Reason is optional free text for the holder's logs.
	Reason string `json:"reason,omitempty"`
}

// WriteTakeoverRequest records req as the pending takeover request for the
// lock file at path, in strings.TrimSuffix(path, ".lock")+".takeover" (for
// <state>/leasefs.lock: <state>/leasefs.takeover), replacing any earlier one.
// A zero req.At is set to the current time. The write is atomic and durable
// (temporary file, fsync, rename, directory fsync); errors are returned
// wrapped with the path. Anyone may write a request; holding the lock is not
// required.
func WriteTakeoverRequest(path string, req TakeoverRequest) error {
	if req.At.IsZero() {
		req.At = time.Now()
	}
	p := takeoverPath(path)
	if err := writeLockJSON(p, req); err != nil {
		return fmt.Errorf("daemonlock: write takeover request %s: %w", p, err)
	}
	return nil
}

// ReadTakeoverRequest returns the pending takeover request for the lock file
// at path (see [WriteTakeoverRequest] for where it lives) and whether one was
// present and well-formed.
func ReadTakeoverRequest(path string) (TakeoverRequest, bool) {
	var req TakeoverRequest
	if !readLockJSON(takeoverPath(path), &req) {
		return TakeoverRequest{}, false
	}
	return req, true
}

// ClearTakeoverRequest removes the pending takeover request for the lock file
// at path (see [WriteTakeoverRequest] for where it lives). A missing request
// is not an error; other failures are returned wrapped with the path.
func ClearTakeoverRequest(path string) error {
	p := takeoverPath(path)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("daemonlock: clear takeover request: %w", err)
	}
	return nil
}

// maxLockJSON bounds what readLockJSON accepts; the files it reads are a few
// hundred bytes.
const maxLockJSON = 64 << 10

// readLockJSON decodes the JSON file at path into v and reports whether it
// existed and decoded.
func readLockJSON(path string, v any) bool {
	// O_NONBLOCK: a FIFO in its place must not block the read.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return false
	}
	b, err := io.ReadAll(io.LimitReader(f, maxLockJSON+1))
	if err != nil || len(b) > maxLockJSON {
		return false
	}
	return json.Unmarshal(b, v) == nil
}

// writeLockJSON replaces the file at path with v as JSON (mode 0600): it
// writes a temporary file in the same directory, fsyncs it, renames it over
// path and fsyncs the directory, so readers see the old or the new content and
// the new content survives a crash once writeLockJSON returns.
func writeLockJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	dir := filepath.Dir(path)
	pf, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithStaticPermissions(0o600))
	if err != nil {
		return err
	}
	defer pf.Cleanup()
	if _, err := pf.Write(data); err != nil {
		return err
	}
	if err := pf.CloseAtomicallyReplace(); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
