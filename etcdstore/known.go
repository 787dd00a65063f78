package etcdstore

import "github.com/leasefs/leasefs/leasecore"

// Known returns the live lease on resource and the waiters queued on it as
// this store last learned them (its own transactions, the name's watch,
// its reads), without a round trip; see [leasecore.KnownReader]. A name
// the store does not follow (follow.go) shows no lease and no waiters. A
// lease its view shows dead by the rules of docs/PROTOCOL.md §5 is not
// live.
func (s *Store) Known(resource string) (l leasecore.Lease, live bool, waiters int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	waiters = len(s.queue[resource])
	r := s.live[resource]
	if r == nil {
		return leasecore.Lease{}, false, waiters
	}
	l = s.snapshot(r, int64(waiters))
	return l, l.Live(), waiters
}

var _ leasecore.KnownReader = (*Store)(nil)

// waitersOf returns how many waiter keys the store's view holds for
// resource. The caller holds mu.
func (s *Store) waitersOf(resource string) int64 { return int64(len(s.queue[resource])) }
