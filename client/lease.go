package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Lease is a token lease held through an open file of its lease file
// (docs/PROTOCOL.md §3). It is safe for concurrent use; mu serializes the
// system calls on its descriptor.
type Lease struct {
	mount, resource, path string
	token                 string
	o                     options

	mu     sync.Mutex
	fd     int     // -1 once closed
	st     *Status // as last read
	ended  chan struct{}
	closed bool
}

// Reserve reserves name under mount as a token lease: an O_EXCL create
// and the first read of the new file, which returns the token once
// (docs/PROTOCOL.md §3). Errors: a *HeldError (ErrHeld, EEXIST) when the
// name has a live lease; a *NamespaceError (ErrNoNamespace, ENOENT) when
// its namespace is missing; ErrNotMounted; otherwise the errno of the
// create in an *os.PathError (EDQUOT over the uid's quota, EISDIR on a
// namespace's name, EINVAL or ENAMETOOLONG for a bad name, EAGAIN during a
// handover, §8b).
func Reserve(mount, name string, opts ...Option) (*Lease, error) {
	path, err := leasePath(mount, name)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, createError(mount, name, path, "reserve", err)
	}
	// One read of 44 bytes or more returns the whole token and its newline.
	buf := make([]byte, 128)
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "read token", Path: path, Err: err}
	}
	tok := strings.TrimSpace(string(buf[:n]))
	if !strings.HasPrefix(tok, "hwl_") {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: the first read returned no token (another reader of this uid took it)", path)
	}
	l, err := newLease(mount, name, path, tok, fd, opts)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Resume takes up a token lease reserved earlier, by this process or
// another, from its token: it opens name for writing and renews once.
// Errors: ErrLost when the name has no live lease (ENOENT) or another lease
// (EACCES: the token is not its token); the errno of the open or write
// otherwise.
func Resume(mount, name, token string, opts ...Option) (*Lease, error) {
	path, err := leasePath(mount, name)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) {
			return nil, lostError(name, err)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	if _, err := unix.Write(fd, []byte(token+"\n")); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.ESTALE) {
			return nil, lostError(name, err)
		}
		return nil, &os.PathError{Op: "renew", Path: path, Err: err}
	}
	return newLease(mount, name, path, token, fd, opts)
}

func newLease(mount, name, path, tok string, fd int, opts []Option) (*Lease, error) {
	st, err := readStatus(fd)
	if err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "read status", Path: path, Err: err}
	}
	return &Lease{mount: mount, resource: name, path: path, token: tok, o: newOptions(opts),
		fd: fd, st: st, ended: make(chan struct{})}, nil
}

// createError turns the errno of a create of name into the package's
// errors (see Reserve).
func createError(mount, name, path, op string, err error) error {
	switch {
	case errors.Is(err, unix.EEXIST):
		return heldError(path, name, err)
	case errors.Is(err, unix.ENOENT):
		if ne := missingNamespace(mount, name, err); ne != nil {
			return ne
		}
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}

// Resource returns the lease name relative to the mount, e.g. "ci/deploy".
func (l *Lease) Resource() string { return l.resource }

// Token returns the lease's token (43 bytes, "hwl_…"). Keep it secret: it
// renews and ends the lease.
func (l *Lease) Token() string { return l.token }

// ID returns the lease id.
func (l *Lease) ID() string { return l.Status().LeaseID }

// Generation returns the fencing token (docs/PROTOCOL.md §1).
func (l *Lease) Generation() uint64 { return l.Status().Generation }

// Status returns the status document as last read: at the reserve and
// after each renew.
func (l *Lease) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	return *l.st
}

// Annotations are the annotations of a renew, complete or abandon
// (docs/PROTOCOL.md §4.2), by key: "actor_session_id",
// "task_assignment_id", "anchor_state", "anchor_root", "path", "client"
// (strings of at most 1 KiB, no NUL) and "pid" (a decimal process id of a
// running process, whose death ends the lease, §5; "0" clears it). A key
// left out stays as it was; an empty string clears it. The daemon refuses
// anything else with EINVAL.
type Annotations map[string]string

// command returns the one write of action with the token and a.
func (l *Lease) command(action string, a Annotations) []byte {
	if action == "renew" && len(a) == 0 {
		return []byte(l.token + "\n")
	}
	var b strings.Builder
	b.WriteString("token = " + tomlString(l.token) + "\n")
	if action != "renew" {
		b.WriteString("action = " + tomlString(action) + "\n")
	}
	for _, k := range slices.Sorted(maps.Keys(a)) {
		v := a[k]
		if k == "pid" {
			if _, err := strconv.Atoi(v); err == nil {
				b.WriteString("pid = " + v + "\n")
				continue
			}
		}
		b.WriteString(k + " = " + tomlString(v) + "\n")
	}
	return []byte(b.String())
}

// Renew moves the heartbeat and applies a (nil: none) in one change
// (docs/PROTOCOL.md §4.2). When the daemon does not answer (ENOTCONN,
// ECONNABORTED), Renew opens the name once more, through whichever daemon
// now serves the mount, and renews through the new open file. Errors:
// ErrLost (ESTALE: the lease ended; ENOENT or EACCES on the new open file:
// the name was freed or leased again); EINVAL for a bad annotation; the
// errno otherwise, ENOTCONN while no daemon answers.
func (l *Lease) Renew(a Annotations) error {
	return l.write("renew", a)
}

// Complete ends the lease with status complete, applying a first; the
// name is free when it returns. Errors as Renew's. The descriptor is
// closed when it succeeds or the lease was lost.
func (l *Lease) Complete(a Annotations) error { return l.write("complete", a) }

// Abandon ends the lease with status abandoned, applying a first (for
// example "anchor_state" saying why). Errors as Complete's.
func (l *Lease) Abandon(a Annotations) error { return l.write("abandon", a) }

// Close closes the lease's descriptor and stops its keep-alive, leaving
// the lease live: it expires a lease duration after its last renew unless
// renewed through another open file ([Resume]). It is idempotent.
func (l *Lease) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closeLocked()
}

func (l *Lease) closeLocked() error {
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.ended)
	if l.fd < 0 {
		return nil
	}
	err := unix.Close(l.fd)
	l.fd = -1
	return err
}

var errClosed = errors.New("lease closed")

func (l *Lease) write(action string, a Annotations) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("%s %s: %w", action, l.resource, errClosed)
	}
	cmd := l.command(action, a)
	var err error
	if l.fd >= 0 {
		_, err = unix.Write(l.fd, cmd)
	} else {
		err = unix.ENOTCONN
	}
	if daemonGone(err) {
		err = l.reopenLocked(cmd)
	}
	switch {
	case errors.Is(err, unix.ESTALE):
		l.closeLocked()
		return lostError(l.resource, err)
	case errors.Is(err, ErrLost):
		l.closeLocked()
		return err
	case err != nil:
		return &os.PathError{Op: action, Path: l.path, Err: err}
	case action != "renew":
		return l.closeLocked()
	}
	if st, err := readStatus(l.fd); err == nil {
		l.st = st
	}
	return nil
}

// reopenLocked opens the name again without creating it and writes cmd
// through the new open file; the daemon that answers binds it to the
// lease the token names, if the name still has it. l.mu is held.
func (l *Lease) reopenLocked(cmd []byte) error {
	if l.fd >= 0 {
		unix.Close(l.fd)
		l.fd = -1
	}
	// Until a leasefs mount answers again, the mountpoint is a plain
	// directory (or a dead mount), where the name is missing.
	if checkMount(l.mount) != nil {
		return unix.ENOTCONN
	}
	fd, err := unix.Open(l.path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES):
		return lostError(l.resource, err)
	case err != nil:
		return err
	}
	if _, err := unix.Write(fd, cmd); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EACCES) {
			return lostError(l.resource, err)
		}
		return err
	}
	l.fd = fd
	l.o.report(Event{Kind: TakenBack, Resource: l.resource})
	return nil
}

// KeepAlive renews the lease in a goroutine every third of its lease
// duration (at least every 100 ms), as etcd's concurrency.Session keeps its
// lease alive. While the daemon does not answer it retries four times a
// second, until the lease's expires_at or the reconnect timeout
// ([WithReconnectTimeout]) passes. The channel receives one value and is
// closed: an ErrLost error once the lease is lost, or nil when ctx ends
// or the holder completes, abandons or closes the lease.
func (l *Lease) KeepAlive(ctx context.Context) <-chan error {
	out := make(chan error, 1)
	go func() {
		defer close(out)
		out <- l.keepAlive(ctx)
	}()
	return out
}

func (l *Lease) keepAlive(ctx context.Context) error {
	var down time.Time
	for {
		st := l.Status()
		next := max(st.Duration()/3, 100*time.Millisecond)
		if !down.IsZero() {
			next = checkEvery
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-l.ended:
			t.Stop()
			return nil
		case <-t.C:
		}
		err := l.Renew(nil)
		switch {
		case err == nil:
			down = time.Time{}
			continue
		case errors.Is(err, errClosed):
			return nil
		case errors.Is(err, ErrLost):
			return err
		case !daemonGone(err) && !errors.Is(err, unix.EAGAIN):
			// A refusal that is not the lease's end (EIO, ENOSPC of a
			// store that could not commit) is retried at the next renew.
			continue
		}
		now := time.Now()
		if down.IsZero() {
			down = now
			l.o.report(Event{Kind: DaemonAway, Resource: l.resource, Err: err})
		}
		if deadline := tokenDeadline(down, l.o.reconnect, st.ExpiresAt); !now.Before(deadline) {
			l.Close()
			return lostError(l.resource, fmt.Errorf("%w; not back by %s", err, deadline.Format(time.RFC3339Nano)))
		}
	}
}

// tokenDeadline is when a token lease whose daemon stopped answering at
// down counts as lost: reconnect after down, and no later than its
// expires_at, after which the store may expire it.
func tokenDeadline(down time.Time, reconnect time.Duration, expires time.Time) time.Time {
	d := down.Add(reconnect)
	if !expires.IsZero() && expires.Before(d) {
		d = expires
	}
	return d
}

// daemonGone reports whether err says the descriptor's daemon is gone
// (ENOTCONN, ECONNABORTED) rather than the lease ended: the lease may
// outlive the daemon (docs/PROTOCOL.md §2).
func daemonGone(err error) bool {
	return errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED)
}

// tomlString quotes s as a TOML basic string: backslash, quote and control
// characters escaped.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
