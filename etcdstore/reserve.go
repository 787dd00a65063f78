package etcdstore

import (
	"context"
	"errors"
	"fmt"
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

// quotaFull reports whether uid holds MaxLeasesPerUID live leases, as this
// store last saw them (docs/PROTOCOL.md §7): the quota may be exceeded by
// the reservations in flight on other mounts at that moment, and
// concurrent reservations of one uid never fail each other. The caller
// holds mu.
func (s *Store) quotaFull(uid uint32) (int, bool) {
	if s.perUID[uid] < s.opts.MaxLeasesPerUID {
		return s.perUID[uid], false
	}
	n := 0
	for _, r := range s.live {
		if r.l.HolderUID == uid && s.deadReason(r) == "" {
			n++
		}
	}
	return n, n >= s.opts.MaxLeasesPerUID
}

// reserve is Reserve; with waiterKey set (created at waiterRev) the
// reservation also removes that waiter key, and only while it exists.
func (s *Store) reserve(ctx context.Context, d leasecore.Draft, waiterKey string, waiterRev int64) (leasecore.Grant, error) {
	parent := leasecore.ParentOf(d.Resource)
	var handOver time.Time // until when a hand-over of the name is awaited
	for range maxRetries {
		s.mu.Lock()
		count, full := s.quotaFull(d.HolderUID)
		s.mu.Unlock()
		if full {
			return leasecore.Grant{}, fmt.Errorf("%w: uid %d holds %d live leases", leasecore.ErrQuota, d.HolderUID, count)
		}
		var lid clientv3.LeaseID
		var err error
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
		}
		if waiterKey == "" {
			// No waiter queues: a free name with waiters is being handed
			// to the head of its queue, which no other request may pass
			// (docs/PROTOCOL.md §8a, "Hand-over").
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(s.k.waiters(d.Resource)), "=", 0).WithPrefix())
			orElse = append(orElse, clientv3.OpGet(s.k.waiters(d.Resource), append(clientv3.WithLastCreate(), clientv3.WithKeysOnly())...))
		} else {
			// The waiter still queues and no waiter of the name is older.
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(waiterKey), "=", waiterRev),
				clientv3.Compare(clientv3.CreateRevision(s.k.waiters(d.Resource)), ">", waiterRev-1).WithPrefix())
			then = append(then, clientv3.OpDelete(waiterKey))
			orElse = append(orElse, clientv3.OpGet(waiterKey, clientv3.WithCountOnly()),
				clientv3.OpGet(s.k.waiters(d.Resource), append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...))
		}
		then = append(then, clientv3.OpGet(s.k.waiters(d.Resource), clientv3.WithPrefix(), clientv3.WithCountOnly()))
		cctx, done := s.call(ctx)
		start := time.Now()
		tresp, err := s.cli.Txn(cctx).If(conds...).Then(then...).Else(orElse...).Commit()
		done()
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
				s.learnLive(r, tresp.Header.Revision)
				dead := s.deadReason(r)
				held := s.snapshot(r, int64(s.waiting[d.Resource]))
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
				if last := rs[i].GetResponseRange().Kvs; len(last) > 0 {
					// Free, and handed to the head of its queue: wait for
					// the head's grant, then answer as a held name does.
					if handOver.IsZero() {
						handOver = time.Now().Add(s.opts.SessionTTL + time.Second)
					}
					s.awaitHandOver(d.Resource, last[0].CreateRevision, handOver)
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
		s.mu.Lock()
		s.learnLive(r, rev)
		waiters := tresp.Responses[len(tresp.Responses)-1].GetResponseRange().Count
		s.fill(&l, s.opts.LeaseDuration)
		l.Waiters = int(waiters)
		s.mu.Unlock()
		if l.Mode == leasecore.ModeHandle {
			s.keepAlive(l.ID)
		}
		return leasecore.Grant{Lease: l, Token: token}, nil
	}
	return leasecore.Grant{}, s.tooBusy(s.k.live(d.Resource))
}

// awaitHandOver waits until the store's view, once its watch has shown
// the newest waiter key that a reservation found queuing for resource
// (created at revision at), shows resource held or no waiter queuing for
// it, at the latest until deadline: the waiter
// session's TTL after the wait began, by which the key of a head whose
// daemon is gone has left the queue. The wait is not cut short by the
// caller's context: a reservation runs to its answer (docs/PROTOCOL.md
// §8a, "Interrupts").
func (s *Store) awaitHandOver(resource string, at int64, deadline time.Time) {
	for {
		changed := s.changedChan(resource)
		s.mu.Lock()
		settled := s.watched >= at && (s.live[resource] != nil || len(s.queue[resource]) == 0)
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
