package etcdstore

import (
	"context"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A store follows only the names it must act on (docs/PROTOCOL.md §8a,
// "Changes from other mounts"): its own leases, its own waiters' names,
// and the names its mount's kernel knows ([Options.KernelKnows]). Each
// followed name has a watch of its live key and of its waiter keys,
// started after the revision of the read that answered for the name, so
// nothing between is missed and no extra round trip is made; every read
// that starts a follow therefore carries the name's live key and waiter
// keys. A name no longer wanted is let go by [Store.sweepFollows], and its
// view with it, so that what an idle daemon hears and holds does not grow
// with the changes and leases elsewhere in the cluster.

// follow is this store's interest in one name. Guarded by Store.mu.
type follow struct {
	// liveSeen and waitSeen are the revisions of the last change of the
	// name's live key, and of its waiter keys, that the watch showed: an
	// answer read before them is not learned (see [Store.learnLive]).
	liveSeen, waitSeen int64
	// queueAt: the view of the name's queue holds every waiter key up to
	// this revision (a read of the keys, or the watch after one).
	queueAt int64
	// waitDeleted is the revision of the last waiter key delete the
	// watch showed, at waitDeletedAt (see [Store.mayReserve]).
	waitDeleted   int64
	waitDeletedAt time.Time
	// touched: when a call of this store last read or wrote the name.
	touched time.Time
	cancel  context.CancelFunc
}

// followIdle is how long a name that no rule keeps followed stays
// followed after this store last read or wrote it: the time between a
// lookup and the kernel's inode for it, or between a waiter's turns.
const followIdle = 2 * time.Second

// knownKeep is how long a store remembers a lease after its live key went
// (to answer for it by id until its history is written).
const knownKeep = time.Minute

// observe records what a call read or wrote of resource at revision at —
// its live key (nil: none) and its waiter keys — and follows the name
// from there: a name not yet followed takes this as its view and is
// watched from at+1; a followed one learns it by the rules of
// [Store.learnLive] and [Store.learnQueue]. The caller holds mu.
func (s *Store) observe(resource string, at int64, live *rec, waiters []*mvccpb.KeyValue) {
	f := s.follows[resource]
	if f == nil {
		if s.closed || s.bg.Err() != nil {
			return
		}
		ctx, cancel := context.WithCancel(s.bg)
		f = &follow{liveSeen: at, waitSeen: at, cancel: cancel}
		s.follows[resource] = f
		s.wg.Go(func() { s.watchName(ctx, resource, at) })
	}
	f.touched = time.Now()
	if live != nil {
		s.learnLive(live, at)
	} else {
		s.dropLive(resource, at+1)
	}
	s.learnQueue(resource, at, waiters)
}

// waiterKeys reads resource's waiter keys (keys only): what every read
// that may start a follow carries beside the live key (see
// [Store.observe]).
func (s *Store) waiterKeys(resource string) clientv3.Op {
	return clientv3.OpGet(s.k.waiters(resource), clientv3.WithPrefix(), clientv3.WithKeysOnly())
}

// sawLive records that this store's own transaction changed resource's
// live key at revision rev: an answer read before it is as stale as one
// the watch has overtaken. The caller holds mu.
func (s *Store) sawLive(resource string, rev int64) {
	if f := s.follows[resource]; f != nil {
		f.liveSeen = max(f.liveSeen, rev)
	}
}

// pin keeps resource followed until the returned function is called: for
// a call that waits on the name's changes (a queued waiter, a reservation
// awaiting a hand-over).
func (s *Store) pin(resource string) (unpin func()) {
	s.mu.Lock()
	s.pinned[resource]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.pinned[resource]--; s.pinned[resource] <= 0 {
			delete(s.pinned, resource)
		}
		s.mu.Unlock()
	}
}

// learnQueue replaces the view of resource's queue by waiters, its keys
// read at revision at, unless the watch has shown a change of them after
// at. The caller holds mu.
func (s *Store) learnQueue(resource string, at int64, waiters []*mvccpb.KeyValue) {
	f := s.follows[resource]
	if f == nil || f.waitSeen > at {
		return
	}
	delete(s.queue, resource)
	for _, kv := range waiters {
		s.enqueue(resource, string(kv.Key), kv.CreateRevision)
	}
	f.queueAt = max(f.queueAt, at)
}

// watchName follows resource's live key and waiter keys from revision
// from+1 until ctx ends (the name is let go, or the store closes). A watch
// that ends is started again from the last revision it showed; one that
// etcd compacted past reads the name again ([Store.resync]) and goes on
// from that read.
func (s *Store) watchName(ctx context.Context, resource string, from int64) {
	liveFrom, waitFrom := from, from
	for ctx.Err() == nil {
		// Both watches of a pass share wctx, so that a pass that ends
		// (an error, a compaction) leaves no watcher behind on the stream.
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		live := s.cli.Watch(wctx, s.k.live(resource), clientv3.WithRev(liveFrom+1), clientv3.WithPrevKV())
		waiters := s.cli.Watch(wctx, s.k.waiters(resource), clientv3.WithPrefix(), clientv3.WithRev(waitFrom+1))
		compacted := false
		for {
			var resp clientv3.WatchResponse
			var ok, isLive bool
			select {
			case <-ctx.Done():
			case resp, ok = <-live:
				isLive = true
			case resp, ok = <-waiters:
			}
			if !ok || resp.Err() != nil || resp.CompactRevision != 0 {
				compacted = ok && resp.CompactRevision != 0
				break
			}
			if n := len(resp.Events); n > 0 {
				s.heard.Add(int64(n))
				if isLive {
					s.awaitWrites(ctx, resource)
					liveFrom = resp.Events[n-1].Kv.ModRevision
					s.applyLive(resource, resp.Events)
				} else {
					waitFrom = resp.Events[n-1].Kv.ModRevision
					s.applyWaiters(resource, resp.Events)
				}
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if compacted {
			s.opts.Logger.Warn("etcd compacted past a name's watch; reading the name again", "resource", resource)
			at, err := s.resync(ctx, resource)
			if err == nil {
				liveFrom, waitFrom = at, at
				continue
			}
		}
		s.sleep(100 * time.Millisecond)
	}
}

// resync reads resource's live key and waiter keys again for a watch that
// missed changes, makes them the view (publishing the end of a lease the
// view held that is gone) and returns the read's revision.
func (s *Store) resync(ctx context.Context, resource string) (int64, error) {
	cctx, done := s.call(background(ctx))
	resp, err := s.readTxn(cctx,
		clientv3.OpGet(s.k.live(resource)),
		s.waiterKeys(resource),
	)
	done()
	if err != nil {
		return 0, err
	}
	at := resp.Header.Revision
	var cur *rec
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		cur, _ = s.decode(kvs[0], true)
	}
	s.mu.Lock()
	f := s.follows[resource]
	if f == nil {
		s.mu.Unlock()
		return at, nil
	}
	var gone *rec
	if prev := s.live[resource]; prev != nil && (cur == nil || cur.l.ID != prev.l.ID) {
		gone = prev
		s.dropLive(resource, at+1)
	}
	f.liveSeen, f.waitSeen = at, at // the watch missed what came between: the read decides
	if cur != nil {
		s.setLive(cur)
	}
	s.learnQueue(resource, at, resp.Responses[1].GetResponseRange().Kvs)
	s.mu.Unlock()
	if gone != nil {
		s.endedElsewhere(resource, gone, at)
	}
	s.notify(resource)
	return at, nil
}

// applyWaiters applies changes of resource's waiter keys that its watch
// showed to the view of its queue.
func (s *Store) applyWaiters(resource string, evs []*clientv3.Event) {
	s.mu.Lock()
	f := s.follows[resource]
	for _, ev := range evs {
		rev := ev.Kv.ModRevision
		switch {
		case ev.Type == mvccpb.PUT && ev.IsCreate():
			s.enqueue(resource, string(ev.Kv.Key), ev.Kv.CreateRevision)
		case ev.Type == mvccpb.DELETE:
			s.dequeue(resource, string(ev.Kv.Key))
			if f != nil {
				f.waitDeleted, f.waitDeletedAt = rev, time.Now()
			}
		}
		if f != nil {
			f.waitSeen = max(f.waitSeen, rev)
			f.queueAt = max(f.queueAt, rev)
		}
	}
	s.mu.Unlock()
	s.notify(resource)
}

// sweepFollows lets go of the names this store no longer needs to follow:
// not touched for followIdle, no live lease of its own on them (reserved
// or renewed through it, or a handle lease it keeps alive), not pinned (a
// waiter of its own queued, a reservation awaiting a hand-over), and
// unknown to the kernel of its mount ([Options.KernelKnows], asked
// without mu held). It also forgets leases whose live key went more than knownKeep ago.
func (s *Store) sweepFollows() {
	now := time.Now()
	s.mu.Lock()
	var idle []string
	for resource := range s.follows {
		if s.idle(resource, now) {
			idle = append(idle, resource)
		}
	}
	for id, k := range s.known {
		if !k.goneAt.IsZero() && now.Sub(k.goneAt) > knownKeep && s.handles[id] == nil {
			delete(s.known, id)
		}
	}
	for lid, until := range s.mine {
		if now.After(until.Add(time.Minute)) {
			delete(s.mine, lid) // expired: no lease is on it any more
		}
	}
	s.mu.Unlock()
	if len(idle) == 0 {
		return
	}
	var drop []string
	for _, resource := range idle {
		if s.opts.KernelKnows == nil || !s.opts.KernelKnows(resource) {
			drop = append(drop, resource)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, resource := range drop {
		if !s.idle(resource, now) { // used again while the kernel was asked
			continue
		}
		s.follows[resource].cancel()
		delete(s.follows, resource)
		if r := s.live[resource]; r != nil {
			s.dropLive(resource, r.kv.ModRevision+1)
			if k := s.known[r.l.ID]; k != nil && !k.lost {
				delete(s.known, r.l.ID)
			}
		}
		delete(s.queue, resource)
		delete(s.own, resource)
		if ch := s.changed[resource]; ch != nil {
			close(ch) // whoever waits on it looks again
			delete(s.changed, resource)
		}
	}
}

// idle reports whether followed name resource is kept by no rule but the
// kernel's: not read or written for followIdle, not pinned, no live lease
// of this store's own on it. The caller holds mu.
func (s *Store) idle(resource string, now time.Time) bool {
	f := s.follows[resource]
	if f == nil || now.Sub(f.touched) < followIdle || s.pinned[resource] > 0 {
		return false
	}
	r := s.live[resource]
	return r == nil || !s.owns(r)
}

// owns reports whether live lease r is this store's own to follow: a
// handle lease it keeps alive, or a token lease on one of its buckets (its
// reservation or last renewal was made through this daemon, or its
// predecessor of this identity), whose expiry it records. The caller
// holds mu.
func (s *Store) owns(r *rec) bool {
	if s.handles[r.l.ID] != nil {
		return true
	}
	_, mine := s.mine[clientv3.LeaseID(r.kv.Lease)]
	return mine
}

// Following returns the names this store follows (follow.go), sorted.
// Safe for concurrent use.
func (s *Store) Following() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.follows))
	for r := range s.follows {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// sweeper runs [Store.sweepFollows] every half followIdle until the
// store closes.
func (s *Store) sweeper() {
	t := time.NewTicker(followIdle / 2)
	defer t.Stop()
	for {
		select {
		case <-s.bg.Done():
			return
		case <-t.C:
			s.sweepFollows()
		}
	}
}
