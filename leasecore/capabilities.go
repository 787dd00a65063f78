package leasecore

// The optional capabilities of a [Store], each an interface a store may
// implement and the daemon asks for with a type assertion, and the helper
// that answers for a store without it:
//
//   - [HealthReporter]: the connection to a remote service ([Health]);
//   - [BacklogReporter]: records written behind a journal;
//   - [HandleOwner]: handle leases held through this daemon, and their
//     jeopardy ([OwnsHandle]);
//   - [NameReader]: a namespace or a live lease in one read ([ReadName]);
//   - [KnownReader]: what the store already knows, without a round trip
//     ([Known]);
//   - [LiveLister]: every live lease without a copy of them all.

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

// KnownReader is implemented by stores that can say, from what they have
// already learned and without a round trip, whether a name has a live lease
// and how many blocked flock waiters queue on it (the etcd store's view of
// the cluster, docs/PROTOCOL.md §8a). The daemon's self-unlinks ask it, so
// that raising a directory's IN_DELETE after an end costs the store nothing
// (docs/PROTOCOL.md §6a). Implementations are safe for concurrent use.
type KnownReader interface {
	// Known returns the live lease on resource that the store knows of
	// (live is false when it knows none) and the number of blocked flock
	// waiters it knows queued on resource.
	Known(resource string) (l Lease, live bool, waiters int)
}

// Known returns what store s knows of resource: a [KnownReader]'s answer;
// for any other store, whose state is its own memory (the file store, the
// memory store), its [Store.Live]. A failure of Live counts as no live
// lease.
func Known(ctx context.Context, s Store, resource string) (l Lease, live bool, waiters int) {
	if k, ok := s.(KnownReader); ok {
		return k.Known(resource)
	}
	l, err := s.Live(ctx, resource)
	if err != nil {
		return Lease{}, false, 0
	}
	return l, true, l.Waiters
}

// LiveLister is implemented by stores that can list their live leases
// without copying them all first (the file store and the memory store,
// whose leases are in memory): "leasefs ls" of 100,000 leases spares a
// 40 MB slice. Implementations are safe for concurrent use.
type LiveLister interface {
	// EachLive calls fn with every live lease, sorted by resource as
	// [Store.List] returns them, and n, their number. The *Lease is valid
	// only during the call, and fn must not call the store. It stops at
	// the first error of fn and returns it. Errors: ErrClosed, or fn's.
	EachLive(ctx context.Context, fn func(l *Lease, n int) error) error
}
