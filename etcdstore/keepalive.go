package etcdstore

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/leasecore"
)

// What keeps a lease's keys in the cluster (docs/PROTOCOL.md §8a, "etcd
// store"): no etcd lease is granted per lease.
//
//   - Handle leases of this store live on its handle session: one etcd lease
//     per daemon, of TTL the lease duration, kept alive the Chubby way
//     (Burrows, "The Chubby lock service", OSDI 2006, §2.8) by one loop,
//     whatever the number of handle leases. Their local deadline is the
//     session's.
//   - Token leases live on a bucket: an etcd lease of TTL lease duration +
//     bucket width, shared by every token lease this store reserves or
//     renews while the bucket is current, so that etcd expires a token
//     lease no earlier than its heartbeat + its lease duration. A renewal
//     moves the lease's keys to the current bucket in its one transaction.

// hsession is the etcd lease of this store's handle leases. Guarded by
// Store.mu.
type hsession struct {
	id  clientv3.LeaseID // 0 while none is granted
	ttl time.Duration
	// deadline is the local end of every handle lease on the session
	// (docs/PROTOCOL.md §8a): the send time of the last keep-alive (or the
	// grant) the cluster confirmed, plus the TTL, minus [localMargin]. It
	// is a reading of the real monotonic clock (time.Now), not of
	// Options.Clock: it is compared with etcd's own TTL countdown. It only
	// grows for one id.
	deadline time.Time
}

// errNoSession: the handle session is not granted or past its local
// deadline; a handle lease cannot be kept alive now.
var errNoSession = errors.New("etcdstore: no confirmed handle session")

// handleSession returns the handle session's etcd lease while its local
// deadline is ahead.
func (s *Store) handleSession() (clientv3.LeaseID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hs.id == 0 || !time.Now().Before(s.hs.deadline) {
		return 0, errNoSession
	}
	return s.hs.id, nil
}

// grantHandleSession grants a new handle session of TTL the lease duration
// (whole seconds, rounded up).
func (s *Store) grantHandleSession(ctx context.Context) error {
	cctx, done := s.call(background(ctx))
	sent := time.Now()
	g, err := s.cli.Grant(cctx, s.ttl)
	done()
	if err != nil {
		return err
	}
	ttl := time.Duration(g.TTL) * time.Second
	s.mu.Lock()
	s.hs = hsession{id: g.ID, ttl: ttl, deadline: sent.Add(ttl - localMargin(ttl))}
	s.mu.Unlock()
	return nil
}

// keepHandles keeps the handle session alive until the store closes: a
// keep-alive every [keepAliveEvery] of its TTL, each waiting at most until
// the local deadline; each answer moves the deadline to its send time +
// TTL − margin. etcd counts the TTL from when it received a keep-alive,
// which is after it was sent, so etcd cannot expire the session before this
// store's deadline (up to clock-rate drift, which the margin covers). Once
// the deadline passes without a newer answer, or the cluster says the
// session is gone, every handle lease on it has ended for this store
// ([Store.lost]) and a new session is granted for the next ones.
func (s *Store) keepHandles() {
	for s.bg.Err() == nil {
		s.mu.Lock()
		hs := s.hs
		s.mu.Unlock()
		if hs.id == 0 {
			if err := s.grantHandleSession(s.bg); err != nil {
				s.opts.Logger.Debug("granting the handle session failed; trying again", "err", err)
				if !s.sleep(time.Second) {
					return
				}
			}
			continue
		}
		sent := time.Now()
		if !sent.Before(hs.deadline) {
			s.loseSession(hs.id)
			continue
		}
		kctx, done := context.WithDeadline(background(s.bg), minTime(hs.deadline, sent.Add(s.opts.CallTimeout)))
		resp, err := s.cli.KeepAliveOnce(kctx, hs.id)
		done()
		switch {
		case s.bg.Err() != nil:
			return
		case err == nil && resp.TTL > 0:
			ttl := time.Duration(resp.TTL) * time.Second
			s.mu.Lock()
			if d := sent.Add(ttl - localMargin(ttl)); s.hs.id == hs.id && d.After(s.hs.deadline) {
				s.hs.deadline = d
			}
			s.mu.Unlock()
		case err == nil || isLeaseGone(err):
			s.loseSession(hs.id)
			continue
		default:
			s.opts.Logger.Debug("keep-alive of the handle session failed", "etcd_lease", int64(hs.id), "err", err)
		}
		s.mu.Lock()
		next := minTime(s.hs.deadline, sent.Add(keepAliveEvery(hs.ttl)))
		s.mu.Unlock()
		if !s.sleep(time.Until(next)) {
			return
		}
	}
}

// loseSession ends, for this store, every handle lease on session id and
// forgets the session, so that the next one is granted.
func (s *Store) loseSession(id clientv3.LeaseID) {
	s.mu.Lock()
	if s.hs.id != id {
		s.mu.Unlock()
		return
	}
	s.hs = hsession{}
	ids := make([]string, 0, len(s.handles))
	for hid := range s.handles {
		ids = append(ids, hid)
	}
	s.mu.Unlock()
	for _, hid := range ids {
		s.lost(hid)
	}
}

// sleep waits d or until the store closes, and reports whether it is open.
func (s *Store) sleep(d time.Duration) bool {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-s.bg.Done():
		return false
	case <-t.C:
		return true
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// keepAlive records handle lease id as kept alive by this store's handle
// session, whose deadline is its local end.
func (s *Store) keepAlive(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.handles[id] != nil {
		return
	}
	s.handles[id] = &handle{}
}

// handleDeadline returns the local end of handle lease id kept alive by
// this store, and whether it is one. The caller holds mu.
func (s *Store) handleDeadline(id string) (time.Time, bool) {
	if s.handles[id] == nil {
		return time.Time{}, false
	}
	return s.hs.deadline, true
}

// pastDeadline reports whether handle lease id, kept alive by this store,
// has reached its local deadline; it then ends the lease for this store at
// once rather than when the keep-alive loop next wakes.
func (s *Store) pastDeadline(id string) bool {
	s.mu.Lock()
	d, ok := s.handleDeadline(id)
	past := ok && !time.Now().Before(d)
	s.mu.Unlock()
	if past {
		s.lost(id)
	}
	return past
}

// callFor bounds one cluster call about lease id like [Store.call] and,
// when id is a handle lease this store keeps alive, also by its local
// deadline: a read through the holder's descriptor never waits past the
// moment the lease ends locally.
func (s *Store) callFor(ctx context.Context, id string) (context.Context, context.CancelFunc) {
	d := time.Now().Add(s.callTimeout())
	s.mu.Lock()
	if hd, ok := s.handleDeadline(id); ok {
		d = minTime(d, hd)
	}
	s.mu.Unlock()
	return context.WithDeadline(ctx, d)
}

// stopKeepAlive forgets handle lease id, if this store keeps it alive.
func (s *Store) stopKeepAlive(id string) {
	s.mu.Lock()
	delete(s.handles, id)
	s.mu.Unlock()
}

// lost ends handle lease id for this store after its keep-alive failed.
func (s *Store) lost(id string) {
	s.mu.Lock()
	delete(s.handles, id)
	k := s.known[id]
	if k == nil || k.lost || s.closed {
		s.mu.Unlock()
		return
	}
	k.lost = true
	l := k.last
	l.Status, l.ExpiresAt = leasecore.StatusAbandoned, time.Time{}
	l.CompletedAt = s.opts.Clock.Now().UTC()
	k.last = l
	s.feed.Publish(0, leasecore.Event{Kind: leasecore.EventEnded, Change: leasecore.ChangeExpired, Lease: l})
	s.mu.Unlock()
	s.notify(l.Resource)
	s.opts.Logger.Warn("lease ended", "resource", l.Resource, "lease", id, "generation", l.Generation,
		"status", l.Status, "reason", "keep-alive of the handle lease not confirmed before its local deadline")
	// Remove the key once the cluster answers (it may have kept the etcd
	// lease alive over a restart), so that other mounts see the name free.
	s.removeLater(l)
}

// bucket is the etcd lease that the token leases this store reserves or
// renews are put on until usableUntil: granted with TTL lease duration +
// [bucketWidth] at a send time g, it cannot expire before g + TTL, which is
// no earlier than the heartbeat + lease duration of any lease put on it
// before g + TTL − lease duration. Guarded by Store.mu.
type bucket struct {
	id          clientv3.LeaseID
	usableUntil time.Time
	used        bool // a lease was put on it: worth granting the next ahead of time
}

// bucketWidth is how long one bucket takes the token leases of a store of
// lease duration d: d/4, at least a second. One grant per width (ahead of
// need, in the background, while leases are reserved or renewed) replaces
// a grant and a revoke per lease.
func bucketWidth(d time.Duration) time.Duration { return max(d/4, time.Second) }

// tokenBucket returns the etcd lease to put a token lease on now: the
// current bucket, or a new one granted now when the background has not
// granted it in time.
func (s *Store) tokenBucket(ctx context.Context) (clientv3.LeaseID, error) {
	s.mu.Lock()
	b := s.bucket
	if b.id != 0 && time.Now().Before(b.usableUntil) {
		s.bucket.used = true
		s.mu.Unlock()
		s.wakeBuckets()
		return b.id, nil
	}
	s.mu.Unlock()
	if err := s.grantBucket(ctx); err != nil {
		return 0, s.unreachable(ctx, "grant", string(s.k), err, false)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bucket.used = true
	return s.bucket.id, nil
}

// grantBucket grants a bucket and makes it current.
func (s *Store) grantBucket(ctx context.Context) error {
	d := s.opts.LeaseDuration
	ttl := int64((d + bucketWidth(d) + time.Second - 1) / time.Second)
	cctx, done := s.call(ctx)
	sent := time.Now()
	g, err := s.cli.Grant(cctx, ttl)
	done()
	if err != nil {
		return err
	}
	until := sent.Add(time.Duration(g.TTL)*time.Second - d)
	s.mu.Lock()
	if until.After(s.bucket.usableUntil) {
		s.bucket = bucket{id: g.ID, usableUntil: until}
	}
	s.mu.Unlock()
	return nil
}

func (s *Store) wakeBuckets() {
	select {
	case s.bucketKick <- struct{}{}:
	default:
	}
}

// keepBuckets grants the next bucket half a width before the current one
// stops being usable, while the current one is used, so that a
// reservation or renewal does not wait for a grant. Unused buckets expire
// on their own.
func (s *Store) keepBuckets() {
	w := bucketWidth(s.opts.LeaseDuration)
	for {
		s.mu.Lock()
		b := s.bucket
		s.mu.Unlock()
		if b.used && time.Until(b.usableUntil) <= w/2 {
			if err := s.grantBucket(background(s.bg)); err != nil && s.bg.Err() == nil {
				s.opts.Logger.Debug("granting a token lease bucket failed; trying again", "err", err)
				if !s.sleep(time.Second) {
					return
				}
			}
			continue
		}
		wait := w / 2
		if b.used {
			wait = time.Until(b.usableUntil) - w/2
		}
		t := time.NewTimer(max(wait, 10*time.Millisecond))
		select {
		case <-s.bg.Done():
			t.Stop()
			return
		case <-s.bucketKick:
			t.Stop()
		case <-t.C:
		}
	}
}

// bgKey marks the context of background work (a keep-alive loop, a bucket
// granted ahead of time, pruning): what no system call waits for.
type bgKey struct{}

// background returns ctx marked as background work.
func background(ctx context.Context) context.Context { return context.WithValue(ctx, bgKey{}, true) }

// isBackground reports whether ctx is marked by [background].
func isBackground(ctx context.Context) bool { return ctx.Value(bgKey{}) != nil }
