package etcdstore

import "context"

// A change this store makes to a name's live key publishes its own event
// as soon as the cluster answers, so that the feed shows this store's
// changes of a lease in the order it made them (docs/PROTOCOL.md §8a). The
// name's watch, which shows the same change, waits while such a change is
// in flight ([Store.awaitWrites]) and then skips the events of the
// revisions the change recorded as its own ([Store.isOwn]).

// writeBegin records a change of resource's live key in flight; call
// writeEnd with its revision (0: none was made) once it is answered.
func (s *Store) writeBegin(resource string) {
	s.mu.Lock()
	s.writing[resource]++
	s.mu.Unlock()
}

// writeDone is writeEnd for a caller that does not hold mu.
func (s *Store) writeDone(resource string, rev int64) {
	s.mu.Lock()
	s.writeEnd(resource, rev)
	s.mu.Unlock()
}

// writeEnd closes a change that [Store.writeBegin] opened; rev, when not
// 0, is the revision of the change it made and published. The caller
// holds mu.
func (s *Store) writeEnd(resource string, rev int64) {
	if rev != 0 && s.follows[resource] != nil {
		s.own[resource] = append(s.own[resource], rev)
	}
	if s.writing[resource]--; s.writing[resource] <= 0 {
		delete(s.writing, resource)
		if ch := s.writeIdle[resource]; ch != nil {
			close(ch)
			delete(s.writeIdle, resource)
		}
	}
}

// awaitWrites waits until no change of this store to resource's live key
// is in flight, or ctx ends.
func (s *Store) awaitWrites(ctx context.Context, resource string) {
	for {
		s.mu.Lock()
		if s.writing[resource] == 0 {
			s.mu.Unlock()
			return
		}
		ch := s.writeIdle[resource]
		if ch == nil {
			ch = make(chan struct{})
			s.writeIdle[resource] = ch
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// isOwn reports whether the change of resource's live key at revision rev
// is one this store made and published itself, and forgets revisions up
// to rev. The caller holds mu.
func (s *Store) isOwn(resource string, rev int64) bool {
	revs := s.own[resource]
	mine := false
	n := 0
	for _, r := range revs {
		switch {
		case r == rev:
			mine = true
		case r > rev:
			revs[n] = r
			n++
		}
	}
	if n == 0 {
		delete(s.own, resource)
	} else {
		s.own[resource] = revs[:n]
	}
	return mine
}
