package etcdstore

import "time"

// checkJeopardy puts the handle session in jeopardy when now is past its
// local deadline, and logs it once.
func (s *Store) checkJeopardy(now time.Time) {
	s.mu.Lock()
	n, entered := s.jeopardyLocked(now)
	end := s.hs.deadline
	s.mu.Unlock()
	if entered {
		s.warnJeopardy(n, end)
	}
}

// jeopardyLocked puts the handle session in jeopardy when now is past its
// local deadline and before its end and it keeps handle leases, with every
// handle lease on it, and
// reports how many and whether it entered jeopardy now. The caller holds
// mu and logs the entry ([Store.warnJeopardy]) after releasing it.
func (s *Store) jeopardyLocked(now time.Time) (int, bool) {
	if s.hs.id == 0 || s.hs.jeopardy != nil || len(s.handles) == 0 || now.Before(s.hs.kept) || !now.Before(s.hs.deadline) {
		return 0, false
	}
	s.hs.jeopardy, s.hs.jeopardySince = make(chan struct{}), now
	for _, h := range s.handles {
		h.jeopardy = true
	}
	s.health.JeopardyTotal += uint64(len(s.handles))
	return len(s.handles), true
}

// warnJeopardy logs that n handle leases entered jeopardy, to end at end
// unless a keep-alive is confirmed first.
func (s *Store) warnJeopardy(n int, end time.Time) {
	s.opts.Logger.Warn("handle leases in jeopardy", "handle_leases", n,
		"reason", "keep-alive not confirmed before the local deadline (a leader election, or the cluster out of reach)",
		"ends_in", time.Until(end).Round(time.Millisecond))
}

// jeopardyCountLocked returns how many handle leases are in jeopardy. The
// caller holds mu.
func (s *Store) jeopardyCountLocked() int {
	if s.hs.jeopardy == nil {
		return 0
	}
	n := 0
	for _, h := range s.handles {
		if h.jeopardy {
			n++
		}
	}
	return n
}

// reportJeopardy calls Options.OnJeopardy with the number of handle
// leases in jeopardy when it differs from reported, and returns it. Only
// the keep-alive loop calls it, so that the reports keep their order.
func (s *Store) reportJeopardy(reported int) int {
	if s.opts.OnJeopardy == nil {
		return reported
	}
	s.mu.Lock()
	n := s.jeopardyCountLocked()
	s.mu.Unlock()
	if n != reported {
		s.opts.OnJeopardy(n)
	}
	return n
}

// Jeopardy returns, while handle lease id that this store keeps alive is
// in jeopardy, a channel closed when it leaves jeopardy: kept alive, or
// ended; nil otherwise. See [leasecore.HandleOwner] and docs/PROTOCOL.md
// §8a, "Elections and jeopardy". The mount makes the calls of the lease's
// holder wait on it.
func (s *Store) Jeopardy(id string) <-chan struct{} {
	now := time.Now()
	s.mu.Lock()
	h := s.handles[id]
	if h == nil {
		s.mu.Unlock()
		return nil
	}
	n, entered := s.jeopardyLocked(now)
	end := s.hs.deadline
	var ch chan struct{}
	if h.jeopardy && now.Before(end) {
		ch = s.hs.jeopardy
	}
	s.mu.Unlock()
	if entered {
		s.warnJeopardy(n, end)
	}
	if ch == nil {
		return nil
	}
	return ch
}
