package engine

import (
	"github.com/leasefs/leasefs/leasecore"

	"context"
	"errors"
	"fmt"
)

// Reserve grants a new lease on d.Resource when it has no live lease; see
// [leasecore.Store.Reserve]. A dead lease on the name is ended as abandoned first
// (docs/PROTOCOL.md §5). The record is durable before Reserve returns.
func (s *Engine) Reserve(ctx context.Context, d leasecore.Draft) (leasecore.Grant, error) {
	return s.acquire(ctx, d, false)
}

// Acquire reserves a lease like Reserve, waiting first come first served
// while another holds the name; see [leasecore.Store.Acquire].
func (s *Engine) Acquire(ctx context.Context, d leasecore.Draft) (leasecore.Grant, error) {
	return s.acquire(ctx, d, true)
}

// acquire is Reserve, and with wait Acquire: a caller that finds the name
// held joins its queue and tries again each time it is signalled while at
// the head.
func (s *Engine) acquire(ctx context.Context, d leasecore.Draft, wait bool) (leasecore.Grant, error) {
	d, err := leasecore.CheckDraft(d)
	if err != nil {
		return leasecore.Grant{}, err
	}
	g, err := s.acquireCommitted(ctx, d, wait)
	if err != nil && g.Token != "" {
		// Granted in memory, but its commit failed: the caller never
		// learns the token, so nobody can use or release the lease.
		s.abandonUncommitted(g.Lease.ID)
		return leasecore.Grant{}, err
	}
	return g, err
}

// abandonUncommitted ends lease id, whose reservation failed to commit, as
// abandoned (in memory at least: the end is deferrable).
func (s *Engine) abandonUncommitted(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.leases[id]; e != nil && e.Lease.Status == leasecore.StatusActive && !s.closed {
		_ = s.endLocked(e, e.Lease, leasecore.StatusAbandoned, leasecore.ChangeExpired, "its reservation could not be committed", true)
	}
}

// acquireCommitted is acquire after the draft is checked.
func (s *Engine) acquireCommitted(ctx context.Context, d leasecore.Draft, wait bool) (_ leasecore.Grant, err error) {
	if err := s.begin(true); err != nil {
		return leasecore.Grant{}, err
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
			s.persist.PublishWaiters(s.queues.counts())
			s.handOff(d.Resource)
		}
	}()
	for {
		switch {
		case s.closed:
			return leasecore.Grant{}, leasecore.ErrClosed
		case w != nil && w.done && w.err == nil && !s.stillLive(w.grant.Lease.ID):
			// The lease handed to this waiter ended before it woke (a
			// holder of its uid removed the name): the grant is void. The
			// waiter goes back to the head of the queue and gets the name
			// as soon as it is free again.
			w.done, w.grant = false, leasecore.Grant{}
			s.queues.pushFront(d.Resource, w)
			s.persist.PublishWaiters(s.queues.counts())
			s.handOff(d.Resource)
			if w.done {
				continue
			}
		case w != nil && w.done:
			// Granted, even if ctx ended meanwhile: the grant came first,
			// and the caller holds the lease (see [leasecore.Store.Acquire]).
			return w.grant, w.err
		case w == nil && s.queues.count(d.Resource) == 0:
			g, err := s.reserveLocked(d)
			if !errors.Is(err, leasecore.ErrHeld) {
				return g, err
			}
		}
		if w == nil {
			w = s.queues.enqueue(d.Resource, d)
			s.persist.PublishWaiters(s.queues.counts())
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-w.turn:
		}
		s.mu.Lock()
		if ctx.Err() != nil && !w.done {
			return leasecore.Grant{}, ctx.Err()
		}
	}
}

// stillLive reports whether lease id is the live lease of its resource.
// The caller holds mu.
func (s *Engine) stillLive(id string) bool {
	e := s.leases[id]
	return e != nil && e.Lease.Status == leasecore.StatusActive && s.live[e.Lease.Resource] == e
}

// reserveLocked is Reserve with mu held.
func (s *Engine) reserveLocked(d leasecore.Draft) (leasecore.Grant, error) {

	if parent := leasecore.ParentOf(d.Resource); parent != "" {
		if _, ok := s.namespaces[parent]; !ok {
			return leasecore.Grant{}, fmt.Errorf("%w: %q", leasecore.ErrNoNamespace, parent)
		}
	}
	if _, ok := s.namespaces[d.Resource]; ok {
		return leasecore.Grant{}, fmt.Errorf("%w: %q", leasecore.ErrIsNamespace, d.Resource)
	}
	if e := s.live[d.Resource]; e != nil {
		live, err := s.checkLive(e)
		if err != nil {
			return leasecore.Grant{}, err
		}
		if live {
			return leasecore.Grant{}, &leasecore.LeaseHeldError{Holder: s.snapshot(e)}
		}
	}
	if s.perUID[d.HolderUID] >= s.opts.MaxLeasesPerUID {
		// The count includes leases that died since they were last
		// looked at: end those before refusing (docs/PROTOCOL.md §7 limits live ones).
		for _, e := range s.live {
			if e.Lease.HolderUID != d.HolderUID {
				continue
			}
			if _, err := s.checkLive(e); err != nil {
				return leasecore.Grant{}, err
			}
		}
		if s.perUID[d.HolderUID] >= s.opts.MaxLeasesPerUID {
			return leasecore.Grant{}, fmt.Errorf("%w: uid %d holds %d live leases", leasecore.ErrQuota, d.HolderUID, s.perUID[d.HolderUID])
		}
	}
	now := s.opts.Clock.Now().UTC()
	token := leasecore.NewToken()
	l := leasecore.Lease{
		ID:          leasecore.NewLeaseID(),
		Resource:    d.Resource,
		Status:      leasecore.StatusActive,
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
	if err := leasecore.ApplyAnnotations(&l, d.Annotations); err != nil {
		return leasecore.Grant{}, err
	}
	hash := leasecore.HashToken(token)
	err := s.persist.WriteRecord(&l, hash)
	if err != nil {
		return leasecore.Grant{}, err
	}
	s.highGeneration = l.Generation
	e := &Record{Lease: l, Hash: hash, hbMono: s.opts.Clock.Mono()}
	s.leases[l.ID] = e
	s.addLive(e)
	snap := s.snapshot(e)
	s.feed.Publish(0, leasecore.Event{Kind: leasecore.EventReserved, Change: leasecore.ChangeReserved, Lease: snap})
	return leasecore.Grant{Lease: snap, Token: token}, nil
}
