package etcdstore

import "github.com/leasefs/leasefs/leasecore"

// Known returns the live lease on resource and the waiters queued on it as
// this store last learned them (its own transactions, its watch of the
// prefix, its reads), without a round trip; see [leasecore.KnownReader]. A
// lease its view shows dead by the rules of docs/PROTOCOL.md §5 is not
// live.
func (s *Store) Known(resource string) (l leasecore.Lease, live bool, waiters int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	waiters = max(s.waiting[resource], len(s.queue[resource]))
	r := s.live[resource]
	if r == nil {
		return leasecore.Lease{}, false, waiters
	}
	l = s.snapshot(r, int64(waiters))
	return l, l.Live(), waiters
}

var _ leasecore.KnownReader = (*Store)(nil)
