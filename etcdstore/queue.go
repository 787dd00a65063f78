package etcdstore

import (
	"context"
	"errors"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/internal/retrylog"
	"github.com/leasefs/leasefs/leasecore"
)

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

// acquireOnce queues one waiter key for d and waits until it reserves the
// name, as the head of the queue, or the key is gone (errWaiterGone).
//
// Whether the key is at the head is decided from what the watch has
// shown of the queue (see [Store.mayReserve]): no read, and only the
// head's daemon acts when the name comes free, so that a hand-over costs
// the end's transaction and the head's reservation (docs/PROTOCOL.md §8a).
// The reservation compares that no waiter key of the name is older than
// this one, so a view that is behind can delay a waiter, never let it
// pass another.
func (s *Store) acquireOnce(ctx context.Context, d leasecore.Draft) (leasecore.Grant, error) {
	key := s.k.waiters(d.Resource) + leasecore.NewLeaseID()
	// The key leaves the queue however the call ends, even when the Put
	// itself failed: a Put cut short by ctx or the call timeout may have
	// been applied, and a waiter key left behind would stand at the head
	// of the queue, ahead of every later waiter, for as long as this
	// daemon's session lasts. A reservation that succeeded deleted the
	// key in its own transaction, so that a hand-over costs no third
	// call.
	granted := false
	defer func() {
		if !granted {
			s.dropWaiter(key)
		}
	}()
	defer s.pin(d.Resource)()
	// One transaction queues the key and reads the name's live key and
	// waiter keys at its revision, from which the store follows the name
	// (see [Store.observe]): the queue is then known up to this key.
	cctx, done := s.call(ctx)
	put, err := s.cli.Txn(cctx).Then(
		clientv3.OpPut(key, uidString(d.HolderUID), clientv3.WithLease(s.sessionID())),
		clientv3.OpGet(s.k.live(d.Resource)),
		s.waiterKeys(d.Resource),
	).Commit()
	done()
	if err != nil {
		return leasecore.Grant{}, s.unreachable(ctx, "queue", key, err, false)
	}
	myRev := put.Header.Revision
	var cur *rec
	if kvs := put.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		cur, _ = s.decode(kvs[0], true)
	}
	s.mu.Lock()
	s.observe(d.Resource, myRev, cur, put.Responses[2].GetResponseRange().Kvs)
	s.learnWaiter(d.Resource, key, myRev, myRev)
	s.mu.Unlock()
	// Until the watch has shown the queue up to this key, the store does
	// not know every older waiter: after watchLag it asks the cluster once.
	asked := false
	lag := time.NewTimer(watchLag)
	defer lag.Stop()
	for {
		changed := s.changedChan(d.Resource)
		try, known, recheck := s.mayReserve(d.Resource, key, myRev)
		if !known && !asked && lagged(lag) {
			asked = true
			if try, err = s.isHead(ctx, d.Resource, key); err != nil {
				return leasecore.Grant{}, err
			}
		}
		if try {
			if err := ctx.Err(); err != nil {
				return leasecore.Grant{}, err
			}
			// At the head: the reservation is not cut short by ctx,
			// whose end mid-call would leave it unknown whether the
			// cluster granted the lease, which nobody would then hold
			// or release; a grant made is returned, as
			// [leasecore.Store.Acquire] says.
			g, err := s.reserve(context.WithoutCancel(ctx), d, key, myRev)
			if err == nil {
				granted = true
				return g, nil
			}
			if !errors.Is(err, leasecore.ErrHeld) && !errors.Is(err, errNotHead) {
				return g, err
			}
		}
		var wake, again <-chan time.Time
		if !known && !asked {
			wake = lag.C
		}
		var recheckTimer *time.Timer
		if recheck > 0 {
			recheckTimer = time.NewTimer(recheck)
			again = recheckTimer.C
		}
		select {
		case <-ctx.Done():
			return leasecore.Grant{}, ctx.Err()
		case <-s.bg.Done():
			return leasecore.Grant{}, leasecore.ErrClosed
		case <-changed:
		case <-wake:
			lag.Reset(0) // read by lagged on the next turn
		case <-again:
		}
		if recheckTimer != nil {
			recheckTimer.Stop()
		}
	}
}

// watchLag is how long a waiter trusts the watch to show the queue up to
// its own key before it reads the head of the queue itself.
const watchLag = time.Second

// lagged reports whether timer t has fired (its value is consumed).
func lagged(t *time.Timer) bool {
	select {
	case <-t.C:
		return true
	default:
		return false
	}
}

// isHead reads whether waiter key is the oldest waiter of resource, and
// records the head in the store's view of the queue.
func (s *Store) isHead(ctx context.Context, resource, key string) (bool, error) {
	cctx, done := s.call(ctx)
	head, err := s.cli.Get(cctx, s.k.waiters(resource), clientv3.WithFirstCreate()...)
	done()
	if err != nil {
		return false, s.unreachable(ctx, "read", s.k.waiters(resource), err, false)
	}
	if len(head.Kvs) == 0 {
		return false, errWaiterGone
	}
	s.seeRev(head.Header.Revision)
	s.mu.Lock()
	s.learnWaiter(resource, string(head.Kvs[0].Key), head.Kvs[0].CreateRevision, head.Header.Revision)
	s.mu.Unlock()
	return string(head.Kvs[0].Key) == key, nil
}

// enqueue records waiter key of resource, created at revision rev, in the
// store's view of the queue. The caller holds mu.
func (s *Store) enqueue(resource, key string, rev int64) {
	q := s.queue[resource]
	if q == nil {
		q = make(map[string]int64)
		s.queue[resource] = q
	}
	q[key] = rev
}

// learnWaiter records waiter key of resource, created at revision rev,
// which a call answered at revision at showed ([Store.enqueue]), unless
// the watch has already shown a change after at: the watch's view then
// holds the key or its delete, and a key it has seen deleted, recorded
// again, would stand ahead of every later waiter of the name for as long
// as the daemon runs. The caller holds mu.
func (s *Store) learnWaiter(resource, key string, rev, at int64) {
	if f := s.follows[resource]; f == nil || f.waitSeen > at {
		return
	}
	s.enqueue(resource, key, rev)
}

// dequeue forgets waiter key of resource. The caller holds mu.
func (s *Store) dequeue(resource, key string) {
	if q := s.queue[resource]; q != nil {
		delete(q, key)
		if len(q) == 0 {
			delete(s.queue, resource)
		}
	}
}

// mayReserve reports whether waiter key of resource, created at revision
// rev, should try to reserve: the store knows no older waiter and no live
// lease in the way (a dead one its reservation ends). known is false while
// the view of the name's queue is not exact up to rev, when the store
// cannot know every older waiter.
func (s *Store) mayReserve(resource, key string, rev int64) (try, known bool, recheck time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.follows[resource]
	if f == nil {
		return true, false, 0 // let go while the store closes: the compare decides
	}
	f.touched = time.Now()
	known = f.queueAt >= rev
	if _, ok := s.queue[resource][key]; !ok {
		// The watch showed the key deleted (its session expired): the
		// reservation's compare finds it gone.
		return true, true, 0
	}
	for k, r := range s.queue[resource] {
		if r < rev && k != key {
			return false, known, 0
		}
	}
	if cur := s.live[resource]; cur != nil && s.deadReason(cur) == "" {
		return false, known, 0
	}
	// The name looks free with no older waiter. When the last waiter key
	// deleted went after the last change of the live key the watch
	// showed, that delete may be an older waiter's grant, whose live key
	// the other watch has not shown yet (a reservation of the head puts
	// the live key and deletes its waiter key in one transaction): wait
	// for it a moment rather than send a reservation that would fail.
	if f.liveSeen < f.waitDeleted {
		if left := grantLag - time.Since(f.waitDeletedAt); left > 0 {
			return false, known, left
		}
	}
	return true, known, 0
}

// grantLag bounds how long a waiter waits for the live key of a grant
// whose waiter key's delete its watch showed first (see
// [Store.mayReserve]); after it, the waiter tries to reserve. A waiter
// key deleted with no grant (a wait given up) delays the next waiter by as
// much.
const grantLag = time.Second

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
	err := del()
	if err == nil {
		return
	}
	var tries retrylog.Tries
	tries.Failed(s.opts.Logger, slog.LevelWarn, "removing a waiter key failed; trying again every second", err, "key", key)
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
				tries.Succeeded(s.opts.Logger, "waiter key removed after failed tries", "key", key)
				return
			}
			tries.Failed(s.opts.Logger, slog.LevelWarn, "removing a waiter key failed; trying again every second", err, "key", key)
		}
	})
}
