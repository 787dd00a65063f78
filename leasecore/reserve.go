package leasecore

import (
	"context"
	"errors"
	"fmt"
)

// Reserve grants a new lease on d.Resource when it has no live lease; see
// [Store.Reserve]. A dead lease on the name is ended as abandoned first
// (docs/PROTOCOL.md §5). The record is durable before Reserve returns.
func (s *store) Reserve(ctx context.Context, d Draft) (Grant, error) {
	return s.acquire(ctx, d, false)
}

// Acquire reserves a lease like Reserve, waiting first come first served
// while another holds the name; see [Store.Acquire].
func (s *store) Acquire(ctx context.Context, d Draft) (Grant, error) {
	return s.acquire(ctx, d, true)
}

// acquire is Reserve, and with wait Acquire: a caller that finds the name
// held joins its queue and tries again each time it is signalled while at
// the head.
func (s *store) acquire(ctx context.Context, d Draft, wait bool) (Grant, error) {
	d, err := checkDraft(d)
	if err != nil {
		return Grant{}, err
	}
	g, err := s.acquireCommitted(ctx, d, wait)
	if err != nil && g.Token != "" {
		// Granted in memory, but its commit failed: the caller never
		// learns the token, so nobody can use or release the lease.
		s.abandonUncommitted(g.Lease.ID)
		return Grant{}, err
	}
	return g, err
}

// abandonUncommitted ends lease id, whose reservation failed to commit, as
// abandoned (in memory at least: the end is deferrable).
func (s *store) abandonUncommitted(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.leases[id]; e != nil && e.lease.Status == StatusActive && !s.closed {
		_ = s.endLocked(e, e.lease, StatusAbandoned, ChangeExpired, "its reservation could not be committed", true)
	}
}

// acquireCommitted is acquire after the draft is checked.
func (s *store) acquireCommitted(ctx context.Context, d Draft, wait bool) (_ Grant, err error) {
	if err := s.begin(true); err != nil {
		return Grant{}, err
	}
	defer s.unlock(&err)
	if !wait {
		return s.reserveLocked(d)
	}
	var w *waiter
	defer func() {
		if w != nil && !w.done {
			// Interrupted or closed: leave the queue, and let the next
			// waiter have the name if it is free.
			s.queues.remove(d.Resource, w)
			s.persist.publishWaiters(s.queues.counts())
			s.handOff(d.Resource)
		}
	}()
	for {
		switch {
		case s.closed:
			return Grant{}, ErrClosed
		case w != nil && w.done && w.err == nil && !s.stillLive(w.grant.Lease.ID):
			// The lease handed to this waiter ended before it woke (a
			// holder of its uid removed the name): the grant is void. The
			// waiter goes back to the head of the queue and gets the name
			// as soon as it is free again.
			w.done, w.grant = false, Grant{}
			s.queues.pushFront(d.Resource, w)
			s.persist.publishWaiters(s.queues.counts())
			s.handOff(d.Resource)
			if w.done {
				continue
			}
		case w != nil && w.done:
			// Granted, even if ctx ended meanwhile: the grant came first,
			// and the caller holds the lease (see [Store.Acquire]).
			return w.grant, w.err
		case w == nil && s.queues.count(d.Resource) == 0:
			g, err := s.reserveLocked(d)
			if !errors.Is(err, ErrHeld) {
				return g, err
			}
		}
		if w == nil {
			w = s.queues.enqueue(d.Resource, d)
			s.persist.publishWaiters(s.queues.counts())
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-w.turn:
		}
		s.mu.Lock()
		if ctx.Err() != nil && !w.done {
			return Grant{}, ctx.Err()
		}
	}
}

// stillLive reports whether lease id is the live lease of its resource.
// The caller holds mu.
func (s *store) stillLive(id string) bool {
	e := s.leases[id]
	return e != nil && e.lease.Status == StatusActive && s.live[e.lease.Resource] == e
}

// checkDraft validates d and fills its default mode.
func checkDraft(d Draft) (Draft, error) {
	if err := ValidateResource(d.Resource); err != nil {
		return d, err
	}
	switch d.Mode {
	case "":
		d.Mode = ModeToken
	case ModeToken, ModeHandle:
	default:
		return d, fmt.Errorf("%w: mode %q", ErrInvalidArgument, d.Mode)
	}
	return d, nil
}

// reserveLocked is Reserve with mu held.
func (s *store) reserveLocked(d Draft) (Grant, error) {

	if parent := parentOf(d.Resource); parent != "" {
		if _, ok := s.namespaces[parent]; !ok {
			return Grant{}, fmt.Errorf("%w: %q", ErrNoNamespace, parent)
		}
	}
	if _, ok := s.namespaces[d.Resource]; ok {
		return Grant{}, fmt.Errorf("%w: %q", ErrIsNamespace, d.Resource)
	}
	if e := s.live[d.Resource]; e != nil {
		live, err := s.checkLive(e)
		if err != nil {
			return Grant{}, err
		}
		if live {
			return Grant{}, &LeaseHeldError{Holder: s.snapshot(e)}
		}
	}
	if s.perUID[d.HolderUID] >= s.opts.MaxLeasesPerUID {
		// The count includes leases that died since they were last
		// looked at: end those before refusing (docs/PROTOCOL.md §7 limits live ones).
		for _, e := range s.live {
			if e.lease.HolderUID != d.HolderUID {
				continue
			}
			if _, err := s.checkLive(e); err != nil {
				return Grant{}, err
			}
		}
		if s.perUID[d.HolderUID] >= s.opts.MaxLeasesPerUID {
			return Grant{}, fmt.Errorf("%w: uid %d holds %d live leases", ErrQuota, d.HolderUID, s.perUID[d.HolderUID])
		}
	}
	now := s.opts.Clock.Now().UTC()
	token := NewToken()
	l := Lease{
		ID:          NewLeaseID(),
		Resource:    d.Resource,
		Status:      StatusActive,
		Mode:        d.Mode,
		Generation:  s.highGeneration + 1,
		HolderUID:   d.HolderUID,
		HolderGID:   d.HolderGID,
		HolderPID:   d.HolderPID,
		Host:        s.opts.Host,
		StartedAt:   now,
		HeartbeatAt: now,
		BootID:      s.bootID,
	}
	if err := applyAnnotations(&l, d.Annotations); err != nil {
		return Grant{}, err
	}
	hash := HashToken(token)
	stamp, err := s.persist.writeRecord(&l, hash)
	if err != nil {
		return Grant{}, err
	}
	s.highGeneration = l.Generation
	e := &entry{lease: l, hash: hash, hbMono: s.opts.Clock.Mono(), stamp: stamp}
	s.leases[l.ID] = e
	s.addLive(e)
	snap := s.snapshot(e)
	s.feed.Publish(0, Event{Kind: EventReserved, Change: ChangeReserved, Lease: snap})
	return Grant{Lease: snap, Token: token}, nil
}
