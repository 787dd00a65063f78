package leasecore

import "context"

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
