package client

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// DefaultReconnectTimeout is how long, by default, a lease is kept while
// its daemon does not answer (a restart, an upgrade) before it counts as
// lost: the default of "leasefs lock --reconnect-timeout"
// (docs/PROTOCOL.md §8).
const DefaultReconnectTimeout = time.Minute

// checkEvery is how often [HandleLease.KeepAlive] checks its lease, and
// how often a keep-alive tries to take a lease back while the daemon does
// not answer: "leasefs lock"'s four times a second (docs/PROTOCOL.md §8).
const checkEvery = 250 * time.Millisecond

// Option configures [Reserve], [Resume], [Lock] and [TryLock].
type Option func(*options)

type options struct {
	reconnect time.Duration
	grace     time.Duration
	notify    func(Event)
}

func newOptions(opts []Option) options {
	o := options{reconnect: DefaultReconnectTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithReconnectTimeout bounds how long a lease whose daemon stopped
// answering is kept before it counts as lost (default
// DefaultReconnectTimeout; 0 gives it up at once). A token lease is also
// lost once its expires_at passes; a handle lease an etcd store keeps alive
// once its keepalive_until minus the grace of [WithGrace] passes, as
// "leasefs lock" does (docs/PROTOCOL.md §8).
func WithReconnectTimeout(d time.Duration) Option {
	return func(o *options) { o.reconnect = max(d, 0) }
}

// WithGrace is the time the caller needs to stop its work once its lease
// is lost (default 0): while the daemon of a handle lease on etcd does not
// answer, the lease counts as lost this long before its keepalive_until,
// which comes before the cluster can grant the name through another mount
// (docs/PROTOCOL.md §8a).
func WithGrace(d time.Duration) Option {
	return func(o *options) { o.grace = max(d, 0) }
}

// WithNotify calls f, on the goroutine of the check or renew that saw it,
// when the daemon of a lease stops answering and when the lease is taken
// back through the next daemon. f must not call the lease's methods.
func WithNotify(f func(Event)) Option {
	return func(o *options) { o.notify = f }
}

// EventKind says what an [Event] reports.
type EventKind int

const (
	// DaemonAway: the lease's descriptor answered ENOTCONN or
	// ECONNABORTED; its daemon stopped or died (docs/PROTOCOL.md §2). Err
	// is that error.
	DaemonAway EventKind = iota + 1
	// TakenBack: a new daemon bound the same lease to a new open file;
	// After is how long the daemon was away.
	TakenBack
)

// Event reports a daemon going away or a lease taken back ([WithNotify]).
type Event struct {
	Kind     EventKind
	Resource string
	Err      error
	After    time.Duration
}

func (o *options) report(e Event) {
	if o.notify != nil {
		o.notify(e)
	}
}

// errBadName is wrapped by the error of a name that is not a lease name
// relative to the mount.
var errBadName = errors.New("not a lease name relative to the mount")

// leasePath checks name and returns its path under mount. A name is
// relative, without empty, "." or ".." components (docs/PROTOCOL.md §3,
// "Names"); the daemon refuses the rest of what is not a name with EINVAL
// or ENAMETOOLONG.
func leasePath(mount, name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%q: %w", name, errBadName)
	}
	for part := range strings.SplitSeq(name, "/") {
		if part == "" || part == "." || part == ".." {
			return "", fmt.Errorf("%q: %w", name, errBadName)
		}
	}
	if err := checkMount(mount); err != nil {
		return "", err
	}
	return filepath.Join(mount, name), nil
}
