package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/leasecore"
)

// maxRetries bounds how often an operation reads again after losing a race
// with another change; each retry means another change committed.
const maxRetries = 32

// Reserve grants a new lease on d.Resource if it has no live lease and no
// waiter queues for it; see [leasecore.Store.Reserve]. One round trip: a
// transaction that writes the lease when the name is free, no waiter
// queues and its namespace exists, and otherwise reads (its Else branch)
// what is in the way; more only when it ends a dead lease in the way,
// races another change, or finds the name being handed to the head of its
// queue: it then waits for the head's grant (at most the session TTL of
// waiter keys, for a head whose daemon is gone) and reports the name held
// by it (docs/PROTOCOL.md §8a, "Hand-over").
func (s *Store) Reserve(ctx context.Context, d leasecore.Draft) (leasecore.Grant, error) {
	d, err := leasecore.CheckDraft(d)
	if err != nil {
		return leasecore.Grant{}, err
	}
	if err := s.begin(true); err != nil {
		return leasecore.Grant{}, err
	}
	return s.reserve(ctx, d, "", 0)
}

// The per-uid quota of docs/PROTOCOL.md §7 is counted in the cluster: a
// reservation puts a holder key PREFIX/holders/<uid>/<resource> on the
// lease's etcd lease, and reads the uid's holder keys (a count) in the same
// transaction; one that brings the count over MaxLeasesPerUID is taken
// back at once ([Store.takeBack]) and refused. Renewals and binds move the
// key with the lease, ends delete it, an expiry takes it with the etcd
// lease. So the quota is exact across mounts, and concurrent reservations
// of one uid never fail each other below it.

// quotaHint is how long after a reservation of a uid was refused for its
// quota the next ones read the uid's count before they reserve, so that a
// caller retrying over its quota costs the cluster no writes.
const quotaHint = time.Second

// quotaFull reports, for a uid refused for its quota within quotaHint,
// whether it still holds MaxLeasesPerUID live leases: one read. Others
// are not read (false).
func (s *Store) quotaFull(ctx context.Context, uid uint32) (int64, bool, error) {
	s.mu.Lock()
	at, ok := s.quotaFullAt[uid]
	if ok && time.Since(at) >= quotaHint {
		delete(s.quotaFullAt, uid)
		ok = false
	}
	s.mu.Unlock()
	if !ok {
		return 0, false, nil
	}
	cctx, done := s.call(ctx)
	resp, err := s.cli.Get(cctx, s.k.holders(uid), clientv3.WithPrefix(), clientv3.WithCountOnly())
	done()
	if err != nil {
		return 0, false, s.unreachable(ctx, "read", s.k.holders(uid), err, false)
	}
	return resp.Count, resp.Count >= int64(s.opts.MaxLeasesPerUID), nil
}

// endDeadOf ends the leases of uid that this store's view holds and its
// liveness rules have dead (the reaper's work, done at once when they
// would count against uid's quota) and returns how many it ended. A dead
// lease of a name this store does not follow counts until its own daemon
// ends it or its bucket expires.
func (s *Store) endDeadOf(ctx context.Context, uid uint32) int {
	s.mu.Lock()
	var dead []*rec
	for _, r := range s.live {
		if r.l.HolderUID == uid && s.deadReason(r) != "" {
			dead = append(dead, r)
		}
	}
	s.mu.Unlock()
	n := 0
	for _, r := range dead {
		if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err == nil {
			n++
		}
	}
	if n > 0 {
		s.mu.Lock()
		delete(s.quotaFullAt, uid)
		s.mu.Unlock()
	}
	return n
}

// takeBack deletes lease r, which this store has just reserved at revision
// r.kv.ModRevision, with no history record: a reservation over its uid's
// quota. Its end is not published (its reservation was not).
func (s *Store) takeBack(ctx context.Context, r *rec) {
	s.mu.Lock()
	if k := s.known[r.l.ID]; k != nil {
		k.published, k.recorded = true, true
	}
	s.mu.Unlock()
	s.writeBegin(r.l.Resource)
	live := s.k.live(r.l.Resource)
	cctx, done := s.call(ctx)
	resp, err := s.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(live), "=", r.kv.ModRevision)).Then(
		clientv3.OpDelete(live), clientv3.OpDelete(s.k.id(r.l.ID)), clientv3.OpDelete(s.k.holder(r.l.HolderUID, r.l.Resource)),
	).Commit()
	done()
	s.mu.Lock()
	var made int64
	if err == nil && resp.Succeeded {
		made = resp.Header.Revision
		s.dropLive(r.l.Resource, made)
		s.sawLive(r.l.Resource, made)
		delete(s.known, r.l.ID)
	}
	s.writeEnd(r.l.Resource, made)
	s.mu.Unlock()
	if err != nil {
		// Unknown whether it applied: end it once the cluster answers.
		s.removeLater(r.l)
	}
}

// reserve is Reserve; with waiterKey set (created at waiterRev) the
// reservation also removes that waiter key, and only while it exists.
func (s *Store) reserve(ctx context.Context, d leasecore.Draft, waiterKey string, waiterRev int64) (leasecore.Grant, error) {
	parent := leasecore.ParentOf(d.Resource)
	var handOver time.Time // until when a hand-over of the name is awaited
	for range maxRetries {
		count, full, err := s.quotaFull(ctx, d.HolderUID)
		if err != nil {
			return leasecore.Grant{}, err
		}
		if full && s.endDeadOf(ctx, d.HolderUID) == 0 {
			return leasecore.Grant{}, fmt.Errorf("%w: uid %d holds %d live leases", leasecore.ErrQuota, d.HolderUID, count)
		}
		var lid clientv3.LeaseID
		if d.Mode == leasecore.ModeHandle {
			if lid, err = s.handleSession(); err != nil {
				return leasecore.Grant{}, s.unreachable(ctx, "keep-alive", s.k.live(d.Resource), err, false)
			}
		} else if lid, err = s.tokenBucket(ctx); err != nil {
			return leasecore.Grant{}, err
		}
		now := s.opts.Clock.Now().UTC()
		token := leasecore.NewToken()
		l := leasecore.Lease{
			ID: leasecore.NewLeaseID(), Resource: d.Resource, Status: leasecore.StatusActive, Mode: d.Mode,
			HolderUID: d.HolderUID, HolderGID: d.HolderGID, HolderPID: d.HolderPID, Host: s.opts.Host,
			StartedAt: now, HeartbeatAt: now, BootID: s.bootID,
		}
		if err := leasecore.ApplyAnnotations(&l, d.Annotations); err != nil {
			return leasecore.Grant{}, err
		}
		hash := leasecore.HashToken(token)
		value := s.encode(l, hash, chReserved, s.opts.LeaseDuration)
		conds := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(s.k.live(d.Resource)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.k.ns(d.Resource)), "=", 0),
		}
		// What is in the way when the name is not free: read in the same
		// transaction, in this order.
		orElse := []clientv3.Op{
			clientv3.OpGet(s.k.live(d.Resource)),
			clientv3.OpGet(s.k.ns(d.Resource), clientv3.WithCountOnly()),
		}
		if parent != "" {
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(s.k.ns(parent)), ">", 0))
			orElse = append(orElse, clientv3.OpGet(s.k.ns(parent), clientv3.WithCountOnly()))
		}
		then := []clientv3.Op{
			clientv3.OpPut(s.k.live(d.Resource), value, clientv3.WithLease(lid)),
			clientv3.OpPut(s.k.id(l.ID), d.Resource, clientv3.WithLease(lid)),
			clientv3.OpPut(s.k.holder(d.HolderUID, d.Resource), l.ID, clientv3.WithLease(lid)),
			clientv3.OpGet(s.k.holders(d.HolderUID), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		}
		if waiterKey == "" {
			// No waiter queues: a free name with waiters is being handed
			// to the head of its queue, which no other request may pass
			// (docs/PROTOCOL.md §8a, "Hand-over").
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(s.k.waiters(d.Resource)), "=", 0).WithPrefix())
			orElse = append(orElse, s.waiterKeys(d.Resource))
		} else {
			// The waiter still queues and no waiter of the name is older.
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(waiterKey), "=", waiterRev),
				clientv3.Compare(clientv3.CreateRevision(s.k.waiters(d.Resource)), ">", waiterRev-1).WithPrefix())
			then = append(then, clientv3.OpDelete(waiterKey))
			orElse = append(orElse, clientv3.OpGet(waiterKey, clientv3.WithCountOnly()),
				clientv3.OpGet(s.k.waiters(d.Resource), append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...))
		}
		// The name's waiter keys, from which the store follows the name
		// (see [Store.observe]).
		then = append(then, s.waiterKeys(d.Resource))
		s.writeBegin(d.Resource)
		cctx, done := s.call(ctx)
		start := time.Now()
		tresp, err := s.cli.Txn(cctx).If(conds...).Then(then...).Else(orElse...).Commit()
		done()
		var made int64 // the reservation's revision, once it is applied to the view
		if err == nil && tresp.Succeeded {
			made = tresp.Header.Revision
		}
		// Until the reservation is in the view (and its event published,
		// unless it is taken back), the name's watch waits.
		endWrite := sync.OnceFunc(func() { s.writeDone(d.Resource, made) })
		if err != nil || !tresp.Succeeded {
			endWrite()
		}
		if err != nil {
			if isLeaseGone(err) {
				s.forgetLease(lid)
				continue
			}
			// The outcome is unknown: the reservation may have committed,
			// and nobody would hold it (a handle lease on the daemon's
			// session would never expire). Once the cluster answers, end
			// it if it is there (docs/PROTOCOL.md §8a, "Elections").
			s.removeLater(l)
			return leasecore.Grant{}, s.unreachable(ctx, "reserve", s.k.live(d.Resource), err, true)
		}
		s.seeRev(tresp.Header.Revision)
		if !tresp.Succeeded {
			rs := tresp.Responses
			if kvs := rs[0].GetResponseRange().Kvs; len(kvs) > 0 {
				r, err := s.decode(kvs[0], true)
				if err != nil {
					// A record this version cannot read (another
					// version's, or damaged) still holds the name: never
					// delete what may be another daemon's lease.
					return leasecore.Grant{}, &leasecore.LeaseHeldError{Holder: leasecore.Lease{Resource: d.Resource, Status: leasecore.StatusActive}}
				}
				s.mu.Lock()
				if waiterKey == "" {
					s.observe(d.Resource, tresp.Header.Revision, r, rs[len(rs)-1].GetResponseRange().Kvs)
				} else {
					s.learnLive(r, tresp.Header.Revision)
				}
				dead := s.deadReason(r)
				held := s.snapshot(r, s.waitersOf(d.Resource))
				s.mu.Unlock()
				if dead == "" {
					return leasecore.Grant{}, &leasecore.LeaseHeldError{Holder: held}
				}
				if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err != nil && !errors.Is(err, errRaced) {
					return leasecore.Grant{}, err
				} else if err == nil {
					s.logEnd(r.l, dead)
				}
				continue
			}
			if rs[1].GetResponseRange().Count > 0 {
				return leasecore.Grant{}, fmt.Errorf("%w: %q", leasecore.ErrIsNamespace, d.Resource)
			}
			i := 2
			if parent != "" {
				if rs[i].GetResponseRange().Count == 0 {
					return leasecore.Grant{}, fmt.Errorf("%w: %q", leasecore.ErrNoNamespace, parent)
				}
				i++
			}
			if waiterKey == "" {
				if waiters := rs[i].GetResponseRange().Kvs; len(waiters) > 0 {
					// Free, and handed to the head of its queue: wait for
					// the head's grant, then answer as a held name does.
					s.mu.Lock()
					s.observe(d.Resource, tresp.Header.Revision, nil, waiters)
					s.mu.Unlock()
					if handOver.IsZero() {
						handOver = time.Now().Add(s.opts.SessionTTL + time.Second)
					}
					s.awaitHandOver(d.Resource, tresp.Header.Revision, handOver)
				}
				continue
			}
			if waiterKey != "" {
				if rs[i].GetResponseRange().Count == 0 {
					return leasecore.Grant{}, errWaiterGone
				}
				if head := rs[i+1].GetResponseRange().Kvs; len(head) > 0 && string(head[0].Key) != waiterKey {
					s.mu.Lock()
					s.learnWaiter(d.Resource, string(head[0].Key), head[0].CreateRevision, tresp.Header.Revision)
					s.mu.Unlock()
					return leasecore.Grant{}, errNotHead
				}
			}
			continue
		}
		s.committed(start)
		// The generation is the revision of this transaction.
		rev := tresp.Header.Revision
		l.Generation = uint64(rev)
		r := &rec{l: l, hash: hash, change: chReserved, daemon: s.opts.DaemonID, duration: s.opts.LeaseDuration,
			kv: &mvccpb.KeyValue{Key: []byte(s.k.live(d.Resource)), Value: []byte(value), CreateRevision: rev, ModRevision: rev, Lease: int64(lid)}}
		waiters := tresp.Responses[len(tresp.Responses)-1].GetResponseRange().Kvs
		if held := tresp.Responses[3].GetResponseRange().Count; held > int64(s.opts.MaxLeasesPerUID) {
			s.mu.Lock()
			s.observe(d.Resource, rev, r, waiters)
			s.quotaFullAt[d.HolderUID] = time.Now()
			s.mu.Unlock()
			endWrite()
			s.takeBack(context.WithoutCancel(ctx), r)
			if s.endDeadOf(ctx, d.HolderUID) > 0 {
				continue // dead leases do not count (docs/PROTOCOL.md §7)
			}
			return leasecore.Grant{}, fmt.Errorf("%w: uid %d holds %d live leases", leasecore.ErrQuota, d.HolderUID, held-1)
		}
		s.mu.Lock()
		s.fill(&l, s.opts.LeaseDuration)
		l.Waiters = len(waiters)
		s.observe(d.Resource, rev, r, waiters)
		s.sawLive(d.Resource, rev)
		s.feed.Publish(rev, leasecore.Event{Kind: leasecore.EventReserved, Change: leasecore.ChangeReserved, Lease: l})
		s.mu.Unlock()
		endWrite()
		if l.Mode == leasecore.ModeHandle {
			s.keepAlive(l.ID)
		}
		return leasecore.Grant{Lease: l, Token: token}, nil
	}
	return leasecore.Grant{}, s.tooBusy(s.k.live(d.Resource))
}

// awaitHandOver waits until the store's view of resource, exact at least
// up to revision at (when a reservation found it free with waiters),
// shows resource held or no waiter queuing for it, at the latest until
// deadline: the waiter
// session's TTL after the wait began, by which the key of a head whose
// daemon is gone has left the queue. The wait is not cut short by the
// caller's context: a reservation runs to its answer (docs/PROTOCOL.md
// §8a, "Interrupts").
func (s *Store) awaitHandOver(resource string, at int64, deadline time.Time) {
	defer s.pin(resource)()
	for {
		changed := s.changedChan(resource)
		s.mu.Lock()
		f := s.follows[resource]
		settled := f == nil || f.queueAt >= at && (s.live[resource] != nil || len(s.queue[resource]) == 0)
		if f != nil {
			f.touched = time.Now()
		}
		s.mu.Unlock()
		left := time.Until(deadline)
		if settled || left <= 0 {
			return
		}
		t := time.NewTimer(left)
		select {
		case <-changed:
		case <-t.C:
		case <-s.bg.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

// forgetLease drops etcd lease lid as this store's current bucket or
// handle session once the cluster said it is gone, so that the next
// reservation or renewal gets a new one.
func (s *Store) forgetLease(lid clientv3.LeaseID) {
	s.mu.Lock()
	if s.bucket.id == lid {
		s.bucket = bucket{}
	}
	hs := s.hs.id
	s.mu.Unlock()
	if hs == lid {
		s.loseSession(lid, "the cluster says the etcd lease of the daemon's handle leases is gone")
	}
}

// errWaiterGone: an Acquire's waiter key vanished (its session lease
// expired while the cluster was unreachable); it queues again.
var errWaiterGone = errors.New("etcdstore: waiter key gone")

// errNotHead: an Acquire's reservation found an older waiter key of the
// name (now in the store's view of the queue); it waits.
var errNotHead = errors.New("etcdstore: an older waiter queues")

func (s *Store) tooBusy(key string) error {
	return &leasecore.PersistError{Op: "etcd txn", Path: key,
		Err: fmt.Errorf("%w: still racing other changes after %d tries", leasecore.ErrOutcomeUnknown, maxRetries)}
}
