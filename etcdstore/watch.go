package etcdstore

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/leasecore"
)

// Watch returns the change feed: every event of kinds (every event when
// none is given) from now on, in order, until ctx is done or the store
// closes; see [leasecore.Store.Watch]. Events come from the watches of the
// names this store follows (follow.go: its own leases and waiters, the
// names its mount's kernel knows), in revision order for each name, and
// from its own ends; the end of a handle lease whose keep-alive this store
// lost is published by this store alone.
func (s *Store) Watch(ctx context.Context, kinds ...leasecore.EventKind) <-chan leasecore.Event {
	s.mu.Lock()
	from := s.rev
	s.mu.Unlock()
	return s.feed.Subscribe(ctx, from, kinds...)
}

// watchNamespaces follows the namespace keys from revision from+1 until
// the store closes, keeping the store's view of namespaces (see
// [Store.learnNS]). Namespaces change rarely (mkdir, rmdir), so every
// daemon hears every such change. After a compaction past the watch the
// view is dropped and learned again.
func (s *Store) watchNamespaces(from int64) {
	for s.bg.Err() == nil {
		wch := s.cli.Watch(clientv3.WithRequireLeader(s.bg), s.k.nsPrefix(""),
			clientv3.WithPrefix(), clientv3.WithRev(from+1))
		for resp := range wch {
			if resp.CompactRevision != 0 {
				s.opts.Logger.Warn("etcd compacted past the watch of namespaces; they are read again as they are looked up",
					"from", from, "compacted", resp.CompactRevision)
				from = resp.CompactRevision - 1
				s.mu.Lock()
				s.forgetNamespaces(from)
				s.mu.Unlock()
				break
			}
			if err := resp.Err(); err != nil {
				s.opts.Logger.Debug("etcd watch interrupted", "err", err)
				break
			}
			s.mu.Lock()
			for _, ev := range resp.Events {
				_, path := s.k.classify(string(ev.Kv.Key))
				if ev.Type == mvccpb.PUT {
					s.learnNS(decodeNS(path, ev.Kv.Value), ev.Kv.ModRevision)
				} else {
					s.nsRemoved(path, ev.Kv.ModRevision)
				}
				from = ev.Kv.ModRevision
			}
			s.mu.Unlock()
		}
		select {
		case <-s.bg.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// applyLive turns the changes of resource's live key that its watch
// showed into events and the store's view. A change this store made
// itself is only applied: its call published it ([Store.writeBegin]). A
// delete by anyone else is an end elsewhere ([Store.endedElsewhere]).
func (s *Store) applyLive(resource string, evs []*clientv3.Event) {
	for _, ev := range evs {
		rev := ev.Kv.ModRevision
		s.mu.Lock()
		if f := s.follows[resource]; f != nil {
			f.liveSeen = max(f.liveSeen, rev)
		}
		s.rev = max(s.rev, rev)
		mine := s.isOwn(resource, rev) // its call published it: apply only
		s.mu.Unlock()
		if ev.Type == mvccpb.PUT {
			r, err := s.decode(ev.Kv, true)
			if err != nil {
				continue
			}
			s.mu.Lock()
			s.setLive(r)
			if !mine {
				e := leasecore.Event{Kind: leasecore.EventChanged, Change: changeOr(r.change, leasecore.ChangeRenewed), Lease: r.l}
				if ev.IsCreate() {
					e.Kind, e.Change = leasecore.EventReserved, leasecore.ChangeReserved
				}
				s.fill(&e.Lease, s.durationOf(r))
				s.feed.Publish(rev, e)
			}
			s.mu.Unlock()
			s.notify(resource)
			continue
		}
		if mine {
			s.mu.Lock()
			s.dropLive(resource, rev)
			s.mu.Unlock()
			s.notify(resource)
			continue
		}
		if ev.PrevKv == nil {
			continue
		}
		// The store's view holds the version the delete removed
		// when the watch or a call showed it: no decode then.
		s.mu.Lock()
		prev := s.live[resource]
		s.mu.Unlock()
		if prev == nil || prev.kv.ModRevision != ev.PrevKv.ModRevision {
			var err error
			if prev, err = s.decode(ev.PrevKv, true); err != nil {
				continue
			}
		}
		s.mu.Lock()
		s.dropLive(resource, rev)
		s.mu.Unlock()
		s.endedElsewhere(resource, prev, rev)
	}
}

// endedElsewhere publishes the end of lease prev on resource, which the
// watch (or a read after a compaction) showed gone at revision rev with
// no end of this store's in flight. When the lease is this daemon's own
// it finds out how it ended — its history record, or none when its etcd
// lease expired, which it then records (abandoned), once — and publishes
// that; another daemon's end is published as this store can tell it:
// expired when its liveness rules already had the lease dead, else
// released.
func (s *Store) endedElsewhere(resource string, prev *rec, rev int64) {
	s.mu.Lock()
	k := s.known[prev.l.ID]
	if k != nil {
		k.goneAt = time.Now()
	}
	if k != nil && (k.lost || k.published) {
		s.mu.Unlock()
		return
	}
	if k != nil {
		k.published = true
	}
	own := s.owns(prev) && !s.opts.ReadOnly
	dead := s.deadReason(prev) != ""
	s.mu.Unlock()
	s.stopKeepAlive(prev.l.ID)
	if own {
		s.wg.Go(func() { s.recordOwnEnd(prev, rev) })
		return
	}
	e := leasecore.Event{Kind: leasecore.EventEnded, Change: leasecore.ChangeReleased, Lease: prev.l}
	e.Lease.Status, e.Lease.ExpiresAt = leasecore.StatusComplete, time.Time{}
	if dead {
		e.Change, e.Lease.Status = leasecore.ChangeExpired, leasecore.StatusAbandoned
	}
	e.Lease.CompletedAt = s.opts.Clock.Now().UTC()
	s.mu.Lock()
	if k != nil {
		k.last = e.Lease
	}
	s.feed.Publish(rev, e)
	s.mu.Unlock()
	s.notify(resource)
}

// recordOwnEnd reads the history record of this daemon's lease prev,
// whose live key went at revision rev by no end of this store's: another
// mount's end wrote one, which is published; an expiry by its etcd lease
// wrote none, and this store records it as abandoned (one transaction,
// only if no record exists) and publishes that.
func (s *Store) recordOwnEnd(prev *rec, rev int64) {
	ctx, done := s.call(background(s.bg))
	resp, err := s.cli.Get(ctx, s.k.history(prev.l.ID))
	done()
	e := leasecore.Event{Kind: leasecore.EventEnded, Change: leasecore.ChangeExpired}
	if err == nil && len(resp.Kvs) > 0 {
		if h, err := s.decode(resp.Kvs[0], false); err == nil {
			e.Lease, e.Change = h.l, changeOr(h.change, leasecore.ChangeExpired)
		}
	}
	if e.Lease.ID == "" {
		e.Lease = prev.l
		e.Lease.Status = leasecore.StatusAbandoned
		e.Lease.CompletedAt = s.opts.Clock.Now().UTC()
		e.Lease.ExpiresAt = time.Time{}
		if err == nil {
			s.writeExpired(prev, e.Lease)
		}
	}
	s.mu.Lock()
	if k := s.known[prev.l.ID]; k != nil {
		k.last = e.Lease
	}
	s.feed.Publish(rev, e)
	s.mu.Unlock()
	s.notify(prev.l.Resource)
}

// writeExpired records lease l, whose live key its etcd lease's expiry
// deleted, as history, once across every store that saw it go.
func (s *Store) writeExpired(prev *rec, l leasecore.Lease) {
	s.wg.Go(func() {
		ctx, done := s.call(s.bg)
		defer done()
		key := s.k.history(l.ID)
		_, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, s.encode(l, prev.hash, chExpired, prev.duration))).Commit()
		if err != nil && s.bg.Err() == nil {
			s.opts.Logger.Warn("recording an expired lease failed", "lease", l.ID, "err", err)
		}
		s.mu.Lock()
		s.ended++
		s.mu.Unlock()
		s.logEnd(l, "etcd lease expired")
	})
}

// changedChan returns a channel closed at the next change of resource's
// live key or waiter keys. Take it before reading, then wait on it.
func (s *Store) changedChan(resource string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.changed[resource]
	if ch == nil {
		ch = make(chan struct{})
		s.changed[resource] = ch
	}
	return ch
}

func (s *Store) notify(resource string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch := s.changed[resource]; ch != nil {
		close(ch)
		delete(s.changed, resource)
	}
}

// Close revokes the session lease of this store's waiter keys within one
// call timeout, then stops the watch, the reaper and every keep-alive and
// ends every change feed. The handle leases it keeps alive are not ended:
// each lives while its open file does (docs/PROTOCOL.md §2, §8a), and the
// next daemon of this identity keeps its etcd lease alive again if it
// starts within the TTL; otherwise the cluster expires it. Further calls
// return ErrClosed. Safe for concurrent use; a second Close is a no-op.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	s.mu.Unlock()
	ctx, done := s.call(context.Background())
	var wg sync.WaitGroup
	if session := s.sessionID(); session != 0 {
		wg.Go(func() { _, _ = s.cli.Revoke(ctx, session) })
	}
	wg.Wait()
	done()
	s.mu.Lock()
	s.closed = true
	for _, ch := range s.changed {
		close(ch)
	}
	s.changed = map[string]chan struct{}{}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.feed.Close()
	return s.cli.Close()
}

// OwnsHandle reports whether handle lease id is one this store keeps alive:
// bound through this daemon's mount (see [leasecore.HandleOwner]).
func (s *Store) OwnsHandle(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handles[id] != nil
}

var _ leasecore.HandleOwner = (*Store)(nil)
