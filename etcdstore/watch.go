package etcdstore

import (
	"context"
	"errors"
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
		switch kind {
		case "waiters":
			s.mu.Lock()
			switch {
			case ev.Type == mvccpb.PUT && ev.IsCreate():
				s.waiting[resource]++
			case ev.Type == mvccpb.DELETE:
				if s.waiting[resource]--; s.waiting[resource] <= 0 {
					delete(s.waiting, resource)
				}
			}
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
			prev, err := s.decode(ev.PrevKv, true)
			if err != nil {
				continue
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

// Acquire reserves a lease like Reserve, waiting first come first served
// across every mount of the store while another holds the name; see
// [leasecore.Store.Acquire]. The caller queues as a waiter key under
// PREFIX/waiters/<resource>//, bound to this store's session lease; the
// waiter with the lowest create revision is served first, as etcd's
// concurrency.Mutex does, and a waiter is woken by the watch.
func (s *Store) Acquire(ctx context.Context, d leasecore.Draft) (leasecore.Grant, error) {
	d, err := leasecore.CheckDraft(d)
	if err != nil {
		return leasecore.Grant{}, err
	}
	if err := s.begin(true); err != nil {
		return leasecore.Grant{}, err
	}
	for {
		g, err := s.acquireOnce(ctx, d)
		if !errors.Is(err, errWaiterGone) {
			return g, err
		}
	}
}

func (s *Store) acquireOnce(ctx context.Context, d leasecore.Draft) (leasecore.Grant, error) {
	key := s.k.waiters(d.Resource) + leasecore.NewLeaseID()
	// The key leaves the queue however the call ends, even when the Put
	// itself failed: a Put cut short by ctx or the call timeout may have
	// been applied, and a waiter key left behind would stand at the head
	// of the queue, ahead of every later waiter, for as long as this
	// daemon's session lasts. Deleting a key that is gone is a no-op.
	defer s.dropWaiter(key)
	cctx, done := s.call(ctx)
	put, err := s.cli.Put(cctx, key, uidString(d.HolderUID), clientv3.WithLease(s.sessionID()))
	done()
	if err != nil {
		return leasecore.Grant{}, s.unreachable(ctx, "queue", key, err, false)
	}
	myRev := put.Header.Revision
	for {
		changed := s.changedChan(d.Resource)
		cctx, done := s.call(ctx)
		head, err := s.cli.Get(cctx, s.k.waiters(d.Resource), clientv3.WithFirstCreate()...)
		done()
		if err != nil {
			return leasecore.Grant{}, s.unreachable(ctx, "read", s.k.waiters(d.Resource), err, false)
		}
		if len(head.Kvs) == 0 {
			return leasecore.Grant{}, errWaiterGone
		}
		if string(head.Kvs[0].Key) == key {
			if err := ctx.Err(); err != nil {
				return leasecore.Grant{}, err
			}
			// At the head: the reservation is not cut short by ctx,
			// whose end mid-call would leave it unknown whether the
			// cluster granted the lease, which nobody would then hold
			// or release; a grant made is returned, as
			// [leasecore.Store.Acquire] says.
			g, err := s.reserve(context.WithoutCancel(ctx), d, key, myRev)
			if !errors.Is(err, leasecore.ErrHeld) {
				return g, err
			}
		}
		select {
		case <-ctx.Done():
			return leasecore.Grant{}, ctx.Err()
		case <-s.bg.Done():
			return leasecore.Grant{}, leasecore.ErrClosed
		case <-changed:
		}
	}
}

// dropWaiter deletes waiter key (a no-op once a reservation removed it).
// When the cluster does not answer, it tries again each second in the
// background until it does or the store closes; the key is bound to the
// session lease, so it goes at the latest when that does.
func (s *Store) dropWaiter(key string) {
	del := func() error {
		ctx, done := s.call(context.Background())
		defer done()
		_, err := s.cli.Delete(ctx, key)
		return err
	}
	if del() == nil {
		return
	}
	s.wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-s.bg.Done():
				return
			case <-t.C:
			}
			err := del()
			if err == nil {
				return
			}
			s.opts.Logger.Debug("removing a waiter key failed; trying again", "key", key, "err", err)
		}
	})
}

// reaper ends leases that the liveness rules killed, from the live leases
// the watch shows (no round trip unless one looks dead), and prunes
// history beyond HistoryKeep at most once a second.
func (s *Store) reaper() {
	tick := time.NewTicker(s.opts.ReapInterval)
	defer tick.Stop()
	lastPrune := time.Now()
	for {
		select {
		case <-s.bg.Done():
			return
		case <-tick.C:
		case <-s.kick:
		}
		s.mu.Lock()
		var dead []*rec
		for _, r := range s.live {
			if s.known[r.l.ID] != nil && s.known[r.l.ID].lost {
				continue // being removed by lost
			}
			if d, ok := s.handleDeadline(r.l.ID); ok && !time.Now().Before(d) {
				continue // its keep-alive loop ends it now (lost)
			}
			if s.deadReason(r) != "" {
				dead = append(dead, r)
			}
		}
		prune := s.ended > 0 && time.Since(lastPrune) >= time.Second
		s.mu.Unlock()
		for _, r := range dead {
			cur, err := s.getLive(background(s.bg), r.l.Resource)
			if err != nil || cur == nil || cur.l.ID != r.l.ID {
				continue
			}
			s.mu.Lock()
			reason := s.deadReason(cur)
			s.mu.Unlock()
			if reason == "" {
				continue
			}
			if _, err := s.end(background(s.bg), cur, cur.l, leasecore.StatusAbandoned, chExpired); err == nil {
				s.logEnd(cur.l, reason)
			} else if !errors.Is(err, errRaced) && s.bg.Err() == nil {
				s.opts.Logger.Error("reap failed", "lease", cur.l.ID, "err", err)
			}
		}
		if prune {
			lastPrune = time.Now()
			s.mu.Lock()
			s.ended = 0
			s.mu.Unlock()
			if err := s.prune(background(s.bg)); err != nil && s.bg.Err() == nil {
				s.opts.Logger.Warn("pruning history failed", "err", err)
			}
		}
	}
}

// prune deletes the oldest history records beyond HistoryKeep (oldest by
// the revision that wrote them). Generations are etcd revisions, so
// pruning never lowers them.
func (s *Store) prune(ctx context.Context) error {
	cctx, done := s.call(ctx)
	resp, err := s.cli.Get(cctx, s.k.historyPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	done()
	if err != nil {
		return err
	}
	excess := resp.Count - int64(s.opts.HistoryKeep)
	for excess > 0 {
		batch := min(excess, 100) // etcd's default limit is 128 operations a transaction
		cctx, done := s.call(ctx)
		old, err := s.cli.Get(cctx, s.k.historyPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend), clientv3.WithLimit(batch))
		done()
		if err != nil {
			return err
		}
		if len(old.Kvs) == 0 {
			return nil
		}
		ops := make([]clientv3.Op, len(old.Kvs))
		for i, kv := range old.Kvs {
			ops[i] = clientv3.OpDelete(string(kv.Key))
		}
		cctx, done = s.call(ctx)
		_, err = s.cli.Txn(cctx).Then(ops...).Commit()
		done()
		if err != nil {
			return err
		}
		excess -= int64(len(old.Kvs))
	}
	return nil
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
