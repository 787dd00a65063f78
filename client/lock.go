package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// HandleLease is a handle lease: an exclusive flock(2) on the lease file
// (docs/PROTOCOL.md §6). It lives as long as its open file: [Unlock] ends
// it, and so does the death of the process. It is safe for concurrent use;
// mu serializes the system calls on its descriptor.
type HandleLease struct {
	mount, resource, path string
	o                     options

	mu      sync.Mutex
	fd      int     // -1 once unlocked
	st      *Status // as last read
	down    time.Time
	downErr error
	lost    error
}

// Lock takes name under mount as a handle lease, waiting first come first
// served while another holds it, until ctx ends. It opens the name with
// O_RDONLY|O_CREAT, as flock(1) does, so that a free name is reserved by
// the open and bound by the lock at once. Errors: ctx.Err() when ctx ended
// the wait (nothing is held or queued); a *NamespaceError
// (ErrNoNamespace); ErrNotMounted; the errno of the open or flock otherwise
// (EISDIR on a namespace, ENOLCK, ESTALE or ENOTCONN when the daemon
// stopped during the wait). See the package doc for how the wait runs.
func Lock(ctx context.Context, mount, name string, opts ...Option) (*HandleLease, error) {
	return lock(ctx, mount, name, true, opts)
}

// TryLock is Lock without waiting. Errors: a *HeldError (ErrHeld,
// EWOULDBLOCK) naming the holder when the name is held (also, briefly,
// during a handover, §8b); the others of Lock.
func TryLock(mount, name string, opts ...Option) (*HandleLease, error) {
	return lock(context.Background(), mount, name, false, opts)
}

func lock(ctx context.Context, mount, name string, wait bool, opts []Option) (*HandleLease, error) {
	path, err := leasePath(mount, name)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, createError(mount, name, path, "open", err)
	}
	// A try first: a free name was reserved by this open file, and the
	// lock binds it at once, so a wait never begins with a reservation of
	// our own that a cancelled wait would leave behind.
	err = flockRetry(fd, unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		if !wait {
			held := heldErrorFd(fd, name, err)
			unix.Close(fd)
			return nil, held
		}
		err = waitLock(ctx, fd)
	}
	if err != nil {
		unix.Close(fd)
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, err
		}
		return nil, &os.PathError{Op: "flock", Path: path, Err: err}
	}
	st, err := readStatus(fd)
	if err != nil {
		_ = unix.Flock(fd, unix.LOCK_UN)
		unix.Close(fd)
		return nil, &os.PathError{Op: "read status", Path: path, Err: err}
	}
	return &HandleLease{mount: mount, resource: name, path: path, o: newOptions(opts), fd: fd, st: st}, nil
}

// heldErrorFd is heldError with the holder read through fd, an open file
// of the held lease.
func heldErrorFd(fd int, resource string, errno error) error {
	e := &HeldError{Resource: resource, Err: errno}
	if st, err := readStatusAttrs(fd); err == nil {
		e.UID, e.PID, e.Host, e.Since = st.HolderUID, st.HolderPID, st.Host, st.StartedAt
	}
	return e
}

// Resource returns the lease name relative to the mount.
func (h *HandleLease) Resource() string { return h.resource }

// ID returns the lease id.
func (h *HandleLease) ID() string { return h.Status().LeaseID }

// Generation returns the fencing token (docs/PROTOCOL.md §1): strictly
// larger for every newer lease of the store.
func (h *HandleLease) Generation() uint64 { return h.Status().Generation }

// Status returns the status document as last read: at the lock and at each
// successful [HandleLease.Check].
func (h *HandleLease) Status() Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	return *h.st
}

// Away reports whether the lease's daemon did not answer at the last
// check and the lease has not been taken back yet.
func (h *HandleLease) Away() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.down.IsZero() && h.lost == nil
}

// Check reads the lease through its descriptor and returns nil while it
// holds. When the daemon does not answer (ENOTCONN, ECONNABORTED), Check
// tries to take the lease back through a new open file of whichever daemon
// now serves the mount, and returns nil while within the reconnect bound
// ([WithReconnectTimeout], [WithGrace]); [HandleLease.Away] tells this
// case apart. A read of a handle lease in jeopardy waits for the cluster
// (docs/PROTOCOL.md §8a) and is not a lost lease. Errors: ErrLost, wrapping
// ESTALE or EIO (the lease ended, or its store failed), or what the
// take-back found (ENOENT, EWOULDBLOCK, another lease id, the bound
// passed); once lost, every later Check returns the same error.
func (h *HandleLease) Check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost != nil {
		return h.lost
	}
	if h.fd < 0 {
		return fmt.Errorf("check %s: %w", h.resource, errUnlocked)
	}
	if h.down.IsZero() {
		st, err := readStatus(h.fd)
		switch {
		case err == nil:
			h.st = st
			return nil
		case errors.Is(err, unix.ESTALE) || errors.Is(err, unix.EIO):
			h.lost = lostError(h.resource, err)
			return h.lost
		case !daemonGone(err):
			// Not an answer about the lease (EINTR, a short read):
			// the next check asks again.
			return nil
		}
		h.down, h.downErr = time.Now(), err
		h.o.report(Event{Kind: DaemonAway, Resource: h.resource, Err: err})
	}
	nfd, err := takeBack(h.mount, h.path, h.st.LeaseID)
	switch {
	case err == nil:
		unix.Close(h.fd)
		h.fd = nfd
		h.o.report(Event{Kind: TakenBack, Resource: h.resource, After: time.Since(h.down)})
		h.down, h.downErr = time.Time{}, nil
		if st, err := readStatus(nfd); err == nil {
			h.st = st
		}
		return nil
	case !errors.Is(err, errNotYet):
		h.lost = lostError(h.resource, err)
		return h.lost
	}
	deadline := reconnectDeadline(h.down, h.o.reconnect, h.o.grace, h.st.KeepAliveUntil)
	if !time.Now().Before(deadline) {
		h.lost = lostError(h.resource, fmt.Errorf("%w; not back by %s", h.downErr, deadline.Format(time.RFC3339Nano)))
		return h.lost
	}
	return nil
}

// KeepAlive checks the lease four times a second in a goroutine
// ([HandleLease.Check]), taking it back after a daemon restart. The
// channel receives one value and is closed: the ErrLost error once the
// lease is lost, or nil when ctx ends or the lease is unlocked.
func (h *HandleLease) KeepAlive(ctx context.Context) <-chan error {
	out := make(chan error, 1)
	go func() {
		defer close(out)
		t := time.NewTicker(checkEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				out <- nil
				return
			case <-t.C:
			}
			err := h.Check()
			switch {
			case errors.Is(err, errUnlocked):
				out <- nil
				return
			case err != nil:
				out <- err
				return
			}
		}
	}()
	return out
}

var errUnlocked = errors.New("unlocked")

// Unlock ends the lease: flock(LOCK_UN), answered once the daemon has
// ended it, so the name is free when Unlock returns (the release that
// follows a close comes only after close returns, docs/PROTOCOL.md §6),
// then close. It is idempotent. Errors: the errno of the unlock (ENOTCONN
// while the daemon is away: the lease then ends with the open file, or by
// the store's rules of §2).
func (h *HandleLease) Unlock() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return nil
	}
	err := unix.Flock(h.fd, unix.LOCK_UN)
	if cerr := unix.Close(h.fd); err == nil {
		err = cerr
	}
	h.fd = -1
	if err != nil && h.lost == nil {
		return &os.PathError{Op: "unlock", Path: h.path, Err: err}
	}
	return nil
}

// errNotYet is takeBack's answer while the mount does not answer yet.
var errNotYet = errors.New("the mount does not answer yet")

// takeBack opens path again without creating it and locks it: a lease of a
// previous daemon binds to the new open file when this process holds the
// old one (docs/PROTOCOL.md §6, "Taking it back"). It returns the new
// locked descriptor when the lease is id; errNotYet while the mount does
// not answer (ENOTCONN, not a FUSE mount yet, EAGAIN while a daemon hands
// over); another error when the lease is lost: ENOENT (it ended),
// EWOULDBLOCK (another holds the name) or a different lease id.
func takeBack(mount, path, id string) (int, error) {
	if checkMount(mount) != nil {
		return -1, errNotYet
	}
	nfd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if daemonGone(err) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return -1, errNotYet
		}
		return -1, fmt.Errorf("reopen: %w", err)
	}
	if err := flockRetry(nfd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(nfd)
		if daemonGone(err) || errors.Is(err, unix.EAGAIN) {
			return -1, errNotYet
		}
		return -1, fmt.Errorf("lock again: %w", err)
	}
	st, err := readStatus(nfd)
	if err == nil && st.LeaseID == id {
		return nfd, nil
	}
	_ = unix.Flock(nfd, unix.LOCK_UN)
	unix.Close(nfd)
	if err != nil {
		return -1, fmt.Errorf("read the lease again: %w", err)
	}
	return -1, fmt.Errorf("the name is now lease %s: %s has ended", st.LeaseID, id)
}

// reconnectDeadline is when a handle lease whose daemon stopped answering
// at down counts as lost: reconnect after down, and on etcd no later than
// the lease's keep-alive deadline until minus grace, so that the holder
// stops before the cluster can expire the lease and grant the name through
// another mount (docs/PROTOCOL.md §8).
func reconnectDeadline(down time.Time, reconnect, grace time.Duration, until time.Time) time.Time {
	d := down.Add(reconnect)
	if !until.IsZero() {
		if e := until.Add(-grace); e.Before(d) {
			d = e
		}
	}
	return d
}

// flockRetry calls flock(2), retrying after EINTR.
func flockRetry(fd, how int) error {
	_, err := retryEINTR(func() (int, error) { return 0, unix.Flock(fd, how) })
	return err
}
