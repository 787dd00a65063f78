package etcdstore

import (
	"context"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/internal/retrylog"
)

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
	s.mine[g.ID] = sent.Add(time.Duration(g.TTL) * time.Second)
	s.mu.Unlock()
	// A daemon key names the bucket, so that the next daemon of this
	// identity follows the token leases on it (and records their
	// expiry): in the background, not in the reservation's way.
	s.wg.Go(func() {
		cctx, done := s.call(background(s.bg))
		defer done()
		_, err := s.cli.Put(cctx, s.k.daemonBucket(s.opts.Host, s.opts.DaemonID, int64(g.ID)), "", clientv3.WithLease(g.ID))
		if err != nil && s.bg.Err() == nil {
			s.opts.Logger.Warn("recording a token lease bucket under the daemon key failed; a next daemon of this identity will not record the expiry of the leases on it",
				"err", err)
		}
	})
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
	var tries retrylog.Tries
	for {
		s.mu.Lock()
		b := s.bucket
		s.mu.Unlock()
		if b.used && time.Until(b.usableUntil) <= w/2 {
			if err := s.grantBucket(background(s.bg)); err != nil && s.bg.Err() == nil {
				tries.Failed(s.opts.Logger, slog.LevelWarn, "granting a token lease bucket failed; trying again every second", err)
				if !s.sleep(time.Second) {
					return
				}
			} else if err == nil {
				tries.Succeeded(s.opts.Logger, "token lease bucket granted after failed tries")
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
