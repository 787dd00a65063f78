package leasecore

import (
	"context"
	"fmt"
	"time"
)

// Health is what a store that depends on a remote service (the etcd store,
// docs/PROTOCOL.md §8a) knows of its connection.
type Health struct {
	// Reachable is false from the first call that failed because the
	// service did not answer until the next call it answered.
	Reachable bool
	// Since is when Reachable last changed (zero: never since the store
	// opened).
	Since time.Time
	// Failures counts the calls that failed because the service did not
	// answer, since the store opened.
	Failures uint64
	// InJeopardy is how many handle leases held through this daemon are
	// in jeopardy now: past their local deadline without a confirmed
	// keep-alive, within the grace period (docs/PROTOCOL.md §8a,
	// "Elections and jeopardy").
	InJeopardy int
	// JeopardyTotal counts the handle leases that entered jeopardy since
	// the store opened; JeopardySaved those of them that left it kept
	// alive (the others ended).
	JeopardyTotal, JeopardySaved uint64
}

// HealthReporter is implemented by stores that have a [Health] to report;
// the file store has none (its disk failures are refusals of their own).
// Implementations are safe for concurrent use.
type HealthReporter interface {
	// Health returns the store's view of its connection now.
	Health() Health
}

// BacklogReporter is implemented by stores that write record files behind
// their journal: the file store (docs/PROTOCOL.md §4.3, "Durability").
// Implementations are safe for concurrent use.
type BacklogReporter interface {
	// LaggingRecords returns how many records have a change that is
	// durable in the journal and not yet in the record file: 0 once every
	// record file says what the journal does. It normally falls back to 0
	// within 100 ms of the last change, and stays above 0 while the disk
	// refuses the writes (full or read-only).
	LaggingRecords() int
}

// HandleOwner is implemented by stores that several daemons share (the
// etcd store, docs/PROTOCOL.md §8a), where the handle leases in the store
// are not all held through this daemon's mount. Implementations are safe
// for concurrent use.
type HandleOwner interface {
	// OwnsHandle reports whether handle lease id is held through this
	// store's daemon: bound by it and kept alive by it.
	OwnsHandle(id string) bool
	// Jeopardy returns, while handle lease id held through this daemon is
	// in jeopardy (docs/PROTOCOL.md §8a, "Elections and jeopardy"), a
	// channel that is closed when it leaves jeopardy: kept alive, or
	// ended. It returns nil when the lease is not in jeopardy.
	Jeopardy(id string) <-chan struct{}
}

// OwnsHandle reports whether l is a handle lease held through the daemon
// of s: for a [HandleOwner], as it says; for any other store, every handle
// lease, since one daemon serves it (docs/PROTOCOL.md §2). A daemon ends,
// when it stops or hands over, only the handle leases it owns (§8a, §8b).
func OwnsHandle(s Store, l Lease) bool {
	if l.Mode != ModeHandle {
		return false
	}
	if o, ok := s.(HandleOwner); ok {
		return o.OwnsHandle(l.ID)
	}
	return true
}

// NameReader is implemented by stores that read what a name is, a
// namespace or a live lease, in one round trip (the etcd store,
// docs/PROTOCOL.md §8a). Implementations are safe for concurrent use.
type NameReader interface {
	// ReadName returns the namespace at resource, or else its live lease,
	// or neither (both nil) when the name is free. Errors: ErrClosed,
	// *PersistError.
	ReadName(ctx context.Context, resource string) (*Namespace, *Lease, error)
}

// ReadName returns what resource names in s: the namespace at resource, or
// else its live lease, or ErrNotFound. It costs a [NameReader] one read;
// any other store is asked for the namespace, then for the live lease.
// Errors: ErrNotFound, and the store's.
func ReadName(ctx context.Context, s Store, resource string) (*Namespace, *Lease, error) {
	if r, ok := s.(NameReader); ok {
		ns, l, err := r.ReadName(ctx, resource)
		if err == nil && ns == nil && l == nil {
			err = fmt.Errorf("%w: no live lease on %q", ErrNotFound, resource)
		}
		return ns, l, err
	}
	if ns, err := s.Namespace(ctx, resource); err == nil {
		return &ns, nil, nil
	}
	l, err := s.Live(ctx, resource)
	if err != nil {
		return nil, nil, err
	}
	return nil, &l, nil
}
