package etcdstore

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/internal/retrylog"
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
	id clientv3.LeaseID // 0 while none is granted
	// ttl is the TTL the cluster granted: lease duration + grace
	// (Options.Grace), in whole seconds.
	ttl time.Duration
	// kept and deadline are readings of the real monotonic clock
	// (time.Now), not of Options.Clock: they are compared with etcd's own
	// TTL countdown. Both only grow for one id. With c the send time of
	// the last keep-alive (or the grant) the cluster confirmed and m the
	// margin of the lease duration ([localMargin]):
	//
	//   - kept = c + (ttl − grace) − m is the local deadline of every
	//     handle lease on the session; past it they are in jeopardy
	//     (docs/PROTOCOL.md §8a, "Elections and jeopardy");
	//   - deadline = c + ttl − m is their local end: kept + grace.
	kept, deadline time.Time
	// jeopardy is non-nil while the session is in jeopardy, and closed
	// when it leaves it (confirmed or lost); see [Store.Jeopardy].
	jeopardy chan struct{}
	// jeopardySince is when the session entered jeopardy.
	jeopardySince time.Time
}

// errNoSession: the handle session is not granted or past its local
// end; a handle lease cannot be kept alive now.
var errNoSession = errors.New("etcdstore: no confirmed handle session")

// handleSession returns the handle session's etcd lease while its local
// end is ahead.
func (s *Store) handleSession() (clientv3.LeaseID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hs.id == 0 || !time.Now().Before(s.hs.deadline) {
		return 0, errNoSession
	}
	return s.hs.id, nil
}

// confirmedAt returns the local deadline and the local end of a handle
// session of TTL ttl whose keep-alive sent at sent the cluster confirmed.
func (s *Store) confirmedAt(sent time.Time, ttl time.Duration) (kept, deadline time.Time) {
	base := max(ttl-s.opts.Grace, time.Second)
	m := localMargin(base)
	return sent.Add(base - m), sent.Add(ttl - m)
}

// grantHandleSession grants a new handle session of TTL the lease duration
// + grace (whole seconds, rounded up).
func (s *Store) grantHandleSession(ctx context.Context) error {
	cctx, done := s.call(background(ctx))
	sent := time.Now()
	g, err := s.cli.Grant(cctx, s.ttl)
	done()
	if err != nil {
		return err
	}
	ttl := time.Duration(g.TTL) * time.Second
	kept, deadline := s.confirmedAt(sent, ttl)
	s.mu.Lock()
	s.hs = hsession{id: g.ID, ttl: ttl, kept: kept, deadline: deadline}
	s.mu.Unlock()
	// The daemon key names the session, so that the next daemon of this
	// identity finds its handle leases without reading the prefix.
	cctx, done = s.call(background(ctx))
	_, err = s.cli.Put(cctx, s.k.daemonSession(s.opts.Host, s.opts.DaemonID), strconv.FormatInt(int64(g.ID), 10), clientv3.WithLease(g.ID))
	done()
	if err != nil && s.bg.Err() == nil {
		s.opts.Logger.Warn("recording the handle session under the daemon key failed; a next daemon of this identity will not find its handle leases, which then expire with the session",
			"err", err)
	}
	return nil
}

// keepHandles keeps the handle session alive until the store closes: a
// keep-alive every [keepAliveEvery] of the lease duration, each waiting at
// most a third of the lease duration (at least a second) and never past
// the local end; each answer moves the local deadline and end (see
// [hsession]) on from its send time. etcd counts the TTL from when it
// received a keep-alive, which is after it was sent, so etcd cannot expire
// the session before this store's local end (up to clock-rate drift, which
// the margin covers). Past the local deadline the session is in jeopardy
// (Chubby's, Burrows, OSDI 2006, §2.8): its leases hold, the calls of
// their holders wait (see [Store.Jeopardy]) and the keep-alives go on; a
// confirmed one ends the jeopardy. Once the local end passes without one,
// or the cluster says the session is gone, every handle lease on it has
// ended for this store ([Store.lost]) and a new session is granted for the
// next ones.
func (s *Store) keepHandles() {
	base := max(time.Duration(s.ttl)*time.Second-s.opts.Grace, time.Second)
	reported := 0
	var grants retrylog.Tries
	for s.bg.Err() == nil {
		s.mu.Lock()
		hs := s.hs
		s.mu.Unlock()
		if hs.id == 0 {
			if err := s.grantHandleSession(s.bg); err != nil {
				if s.bg.Err() == nil {
					grants.Failed(s.opts.Logger, slog.LevelWarn, "granting the handle session failed; trying again every second", err)
				}
				if !s.sleep(time.Second) {
					return
				}
			} else {
				grants.Succeeded(s.opts.Logger, "handle session granted after failed tries")
			}
			continue
		}
		sent := time.Now()
		if !sent.Before(hs.deadline) {
			s.loseSession(hs.id, s.pastEndReason())
			reported = s.reportJeopardy(reported)
			continue
		}
		s.checkJeopardy(sent)
		reported = s.reportJeopardy(reported)
		try := minTime(hs.deadline, sent.Add(min(max(base/3, time.Second), s.opts.CallTimeout)))
		kctx, done := context.WithDeadline(background(s.bg), try)
		resp, err := s.cli.KeepAliveOnce(kctx, hs.id)
		done()
		switch {
		case s.bg.Err() != nil:
			return
		case err == nil && resp.TTL > 0:
			s.confirm(hs.id, sent, time.Duration(resp.TTL)*time.Second)
		case err == nil || isLeaseGone(err):
			s.loseSession(hs.id, "the cluster says the etcd lease of the daemon's handle leases is gone")
			reported = s.reportJeopardy(reported)
			continue
		default:
			s.opts.Logger.Debug("keep-alive of the handle session failed", "etcd_lease", int64(hs.id), "err", err)
		}
		now := time.Now()
		s.checkJeopardy(now)
		reported = s.reportJeopardy(reported)
		s.mu.Lock()
		next := minTime(s.hs.deadline, sent.Add(keepAliveEvery(base)))
		if s.hs.jeopardy == nil && now.Before(s.hs.kept) {
			next = minTime(next, s.hs.kept)
		}
		s.mu.Unlock()
		if !s.sleep(time.Until(next)) {
			return
		}
	}
}

// pastEndReason says why the handle leases end at the session's local end.
func (s *Store) pastEndReason() string {
	if s.opts.Grace > 0 {
		return "keep-alive of the handle lease not confirmed within the grace period after its local deadline"
	}
	return "keep-alive of the handle lease not confirmed before its local deadline"
}

// confirm records that the cluster confirmed, with TTL ttl, the keep-alive
// of session id sent at sent, and ends the session's jeopardy if the new
// local deadline is ahead.
func (s *Store) confirm(id clientv3.LeaseID, sent time.Time, ttl time.Duration) {
	kept, deadline := s.confirmedAt(sent, ttl)
	now := time.Now()
	s.mu.Lock()
	if s.hs.id != id {
		s.mu.Unlock()
		return
	}
	if deadline.After(s.hs.deadline) {
		s.hs.kept, s.hs.deadline = kept, deadline
	}
	if s.hs.jeopardy == nil || !now.Before(s.hs.kept) {
		s.mu.Unlock()
		return
	}
	close(s.hs.jeopardy)
	s.hs.jeopardy = nil
	saved := 0
	for _, h := range s.handles {
		if h.jeopardy {
			h.jeopardy = false
			saved++
		}
	}
	s.health.JeopardySaved += uint64(saved)
	since := s.hs.jeopardySince
	s.mu.Unlock()
	s.opts.Logger.Info("handle leases kept alive through jeopardy", "handle_leases", saved,
		"in_jeopardy_for", now.Sub(since).Round(time.Millisecond), "etcd_lease", int64(id))
}

// loseSession ends, for this store, every handle lease on session id for
// reason and forgets the session, so that the next one is granted.
func (s *Store) loseSession(id clientv3.LeaseID, reason string) {
	s.mu.Lock()
	if s.hs.id != id {
		s.mu.Unlock()
		return
	}
	if s.hs.jeopardy != nil {
		close(s.hs.jeopardy)
	}
	s.hs = hsession{}
	ids := make([]string, 0, len(s.handles))
	for hid := range s.handles {
		ids = append(ids, hid)
	}
	s.mu.Unlock()
	for _, hid := range ids {
		s.lost(hid, reason)
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
// this store (its local deadline + grace), and whether it is one. The
// caller holds mu.
func (s *Store) handleDeadline(id string) (time.Time, bool) {
	if s.handles[id] == nil {
		return time.Time{}, false
	}
	return s.hs.deadline, true
}

// pastDeadline reports whether handle lease id, kept alive by this store,
// has reached its local end; it then ends the lease for this store at
// once rather than when the keep-alive loop next wakes.
func (s *Store) pastDeadline(id string) bool {
	s.mu.Lock()
	d, ok := s.handleDeadline(id)
	past := ok && !time.Now().Before(d)
	s.mu.Unlock()
	if past {
		s.lost(id, s.pastEndReason())
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

// lost ends handle lease id for this store after its keep-alive failed,
// logging reason.
func (s *Store) lost(id string, reason string) {
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
		"status", l.Status, "reason", reason)
	// Remove the key once the cluster answers (it may have kept the etcd
	// lease alive over a restart), so that other mounts see the name free.
	s.removeLater(l)
}

// bgKey marks the context of background work (a keep-alive loop, a bucket
// granted ahead of time, pruning): what no system call waits for.
type bgKey struct{}

// background returns ctx marked as background work.
func background(ctx context.Context) context.Context { return context.WithValue(ctx, bgKey{}, true) }

// isBackground reports whether ctx is marked by [background].
func isBackground(ctx context.Context) bool { return ctx.Value(bgKey{}) != nil }
