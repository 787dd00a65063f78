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
// closes; see [leasecore.Store.Watch]. Events
// of every mount of the store come from one etcd watch of the prefix, in
// revision order; the end of a handle lease whose keep-alive this store
// lost is published by this store alone.
func (s *Store) Watch(ctx context.Context, kinds ...leasecore.EventKind) <-chan leasecore.Event {
	s.mu.Lock()
	from := s.rev
	s.mu.Unlock()
	return s.feed.Subscribe(ctx, from, kinds...)
}

// watch follows the prefix from revision from+1 until the store closes,
// turning changes into events.
func (s *Store) watch(from int64) {
	for s.bg.Err() == nil {
		wch := s.cli.Watch(clientv3.WithRequireLeader(s.bg), string(s.k),
			clientv3.WithPrefix(), clientv3.WithRev(from+1), clientv3.WithPrevKV())
		for resp := range wch {
			if resp.CompactRevision != 0 {
				s.opts.Logger.Warn("etcd compacted past the watch; changes in between are not reported",
					"from", from, "compacted", resp.CompactRevision)
				from = resp.CompactRevision - 1
				s.reloadQueue()
				break
			}
			if err := resp.Err(); err != nil {
				s.opts.Logger.Debug("etcd watch interrupted", "err", err)
				break
			}
			s.apply(resp.Events)
			if n := len(resp.Events); n > 0 {
				from = resp.Events[n-1].Kv.ModRevision
			}
		}
		select {
		case <-s.bg.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// reloadQueue reads every waiter key again, for a watch that missed
// changes (etcd compacted past it): the store's view of the queue decides
// which waiter reserves (see [Store.acquireOnce]).
func (s *Store) reloadQueue() {
	ctx, done := s.call(background(s.bg))
	defer done()
	resp, err := s.cli.Get(ctx, s.k.waitersAll(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		s.opts.Logger.Warn("reading the waiter keys again failed", "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetNamespaces(resp.Header.Revision)
	s.queue, s.waiting = make(map[string]map[string]int64), make(map[string]int)
	for _, kv := range resp.Kvs {
		_, resource := s.k.classify(string(kv.Key))
		s.waiting[resource]++
		s.enqueue(resource, string(kv.Key), kv.CreateRevision)
	}
	for resource := range s.changed {
		if ch := s.changed[resource]; ch != nil {
			close(ch)
			delete(s.changed, resource)
		}
	}
}

// apply turns the events of one watch response into leasecore events. The
// end of a lease and its history record are written by one transaction,
// so they arrive together; a live key deleted without one expired by its
// etcd lease's TTL.
func (s *Store) apply(evs []*clientv3.Event) {
	hist := make(map[int64]map[string]*rec) // revision → lease id → history record
	for _, ev := range evs {
		if kind, _ := s.k.classify(string(ev.Kv.Key)); kind == "history" && ev.Type == mvccpb.PUT {
			if r, err := s.decode(ev.Kv, false); err == nil {
				if hist[ev.Kv.ModRevision] == nil {
					hist[ev.Kv.ModRevision] = make(map[string]*rec)
				}
				hist[ev.Kv.ModRevision][r.l.ID] = r
			}
		}
	}
	for _, ev := range evs {
		rev := ev.Kv.ModRevision
		kind, resource := s.k.classify(string(ev.Kv.Key))
		if kind != "waiters" {
			s.mu.Lock()
			s.watched = max(s.watched, rev)
			s.mu.Unlock()
		}
		switch kind {
		case "ns":
			s.mu.Lock()
			if ev.Type == mvccpb.PUT {
				s.learnNS(decodeNS(resource, ev.Kv.Value), rev)
			} else {
				s.nsRemoved(resource, rev)
			}
			s.mu.Unlock()
		case "waiters":
			s.mu.Lock()
			switch {
			case ev.Type == mvccpb.PUT && ev.IsCreate():
				s.waiting[resource]++
				s.enqueue(resource, string(ev.Kv.Key), ev.Kv.CreateRevision)
			case ev.Type == mvccpb.DELETE:
				if s.waiting[resource]--; s.waiting[resource] <= 0 {
					delete(s.waiting, resource)
				}
				s.dequeue(resource, string(ev.Kv.Key))
			}
			s.watched = max(s.watched, rev)
			s.mu.Unlock()
			s.notify(resource)
		case "history":
			if ev.Type == mvccpb.PUT {
				if r := hist[rev]; r != nil {
					s.mu.Lock()
					for id := range r {
						delete(s.known, id) // its history answers for it now
					}
					s.mu.Unlock()
				}
			}
		case "live":
			if ev.Type == mvccpb.PUT {
				r, err := s.decode(ev.Kv, true)
				if err != nil {
					continue
				}
				e := leasecore.Event{Kind: leasecore.EventChanged, Change: changeOf[r.change]}
				if ev.IsCreate() {
					e.Kind, e.Change = leasecore.EventReserved, leasecore.ChangeReserved
				}
				if e.Change == 0 {
					e.Change = leasecore.ChangeRenewed
				}
				s.mu.Lock()
				s.setLive(r)
				e.Lease = r.l
				s.fill(&e.Lease, s.durationOf(r))
				s.rev = max(s.rev, rev)
				s.feed.Publish(rev, e)
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
			e := leasecore.Event{Kind: leasecore.EventEnded, Change: leasecore.ChangeExpired}
			h := hist[rev][prev.l.ID]
			if h != nil {
				e.Lease = h.l
				if c := changeOf[h.change]; c != 0 {
					e.Change = c
				}
			} else {
				e.Lease = prev.l
				e.Lease.Status = leasecore.StatusAbandoned
				e.Lease.CompletedAt = s.opts.Clock.Now().UTC()
				e.Lease.ExpiresAt = time.Time{}
				if !s.opts.ReadOnly {
					s.writeExpired(prev, e.Lease)
				}
			}
			s.mu.Lock()
			s.dropLive(resource, rev)
			k := s.known[prev.l.ID]
			published := k != nil && k.lost
			if h == nil && k != nil {
				k.last = e.Lease
			}
			s.rev = max(s.rev, rev)
			if !published {
				s.feed.Publish(rev, e)
			}
			s.mu.Unlock()
			s.stopKeepAlive(prev.l.ID)
			s.notify(resource)
		}
	}
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
