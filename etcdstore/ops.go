package etcdstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/leasecore"
)

// maxRetries bounds how often an operation reads again after losing a race
// with another change; each retry means another change committed.
const maxRetries = 32

// Reserve grants a new lease on d.Resource if it has no live lease; see
// [leasecore.Store.Reserve]. Round trips: a read transaction, an etcd lease
// grant and the reserving transaction (three), more when it races.
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

// reserve is Reserve; with waiterKey set (created at waiterRev) the
// reservation also removes that waiter key, and only while it exists.
func (s *Store) reserve(ctx context.Context, d leasecore.Draft, waiterKey string, waiterRev int64) (leasecore.Grant, error) {
	var grant clientv3.LeaseID
	var grantSent time.Time    // when the grant was asked for: its TTL counts from no earlier
	var grantTTL time.Duration // as granted
	defer func() {
		if grant != 0 {
			s.revoke(grant)
		}
	}()
	parent := leasecore.ParentOf(d.Resource)
	for range maxRetries {
		// Read the name, its namespace and the uid's count of live leases.
		ops := []clientv3.Op{
			clientv3.OpGet(s.k.live(d.Resource)),
			clientv3.OpGet(s.k.ns(d.Resource), clientv3.WithCountOnly()),
			clientv3.OpGet(s.k.holders(d.HolderUID), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		}
		if parent != "" {
			ops = append(ops, clientv3.OpGet(s.k.ns(parent), clientv3.WithCountOnly()))
		}
		cctx, done := s.call(ctx)
		resp, err := s.cli.Txn(cctx).Then(ops...).Commit()
		done()
		if err != nil {
			return leasecore.Grant{}, s.unreachable(ctx, "read", s.k.live(d.Resource), err, false)
		}
		s.seeRev(resp.Header.Revision)
		rs := resp.Responses
		if parent != "" && rs[3].GetResponseRange().Count == 0 {
			return leasecore.Grant{}, fmt.Errorf("%w: %q", leasecore.ErrNoNamespace, parent)
		}
		if rs[1].GetResponseRange().Count > 0 {
			return leasecore.Grant{}, fmt.Errorf("%w: %q", leasecore.ErrIsNamespace, d.Resource)
		}
		if kvs := rs[0].GetResponseRange().Kvs; len(kvs) > 0 {
			r, err := s.decode(kvs[0], true)
			if err == nil {
				s.mu.Lock()
				dead := s.deadReason(r)
				held := s.snapshot(r, 0)
				s.mu.Unlock()
				if dead == "" {
					return leasecore.Grant{}, &leasecore.LeaseHeldError{Holder: held}
				}
				if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err != nil && !errors.Is(err, errRaced) {
					return leasecore.Grant{}, err
				}
				s.logEnd(r.l, dead)
				continue
			}
			// A record this version cannot read (another version's, or
			// damaged) still holds the name: never delete what may be
			// another daemon's lease.
			return leasecore.Grant{}, &leasecore.LeaseHeldError{Holder: leasecore.Lease{Resource: d.Resource, Status: leasecore.StatusActive}}
		}
		count := rs[2].GetResponseRange().Count
		if count >= int64(s.opts.MaxLeasesPerUID) {
			freed, err := s.endDeadOf(ctx, d.HolderUID)
			if err != nil {
				return leasecore.Grant{}, err
			}
			if !freed {
				return leasecore.Grant{}, fmt.Errorf("%w: uid %d holds %d live leases", leasecore.ErrQuota, d.HolderUID, count)
			}
			continue
		}
		if grant == 0 {
			cctx, done := s.call(ctx)
			grantSent = time.Now()
			g, err := s.cli.Grant(cctx, s.ttl)
			done()
			if err != nil {
				return leasecore.Grant{}, s.unreachable(ctx, "grant", s.k.live(d.Resource), err, false)
			}
			grant, grantTTL = g.ID, time.Duration(g.TTL)*time.Second
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
		conds := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(s.k.live(d.Resource)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.k.ns(d.Resource)), "=", 0),
			// No lease of this uid was added since it was counted.
			clientv3.Compare(clientv3.ModRevision(s.k.holders(d.HolderUID)), "<", resp.Header.Revision+1).WithPrefix(),
		}
		if parent != "" {
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(s.k.ns(parent)), ">", 0))
		}
		then := []clientv3.Op{
			clientv3.OpPut(s.k.live(d.Resource), s.encode(l, hash, chReserved, s.opts.LeaseDuration), clientv3.WithLease(grant)),
			clientv3.OpPut(s.k.id(l.ID), d.Resource, clientv3.WithLease(grant)),
			clientv3.OpPut(s.k.holder(d.HolderUID, d.Resource), l.ID, clientv3.WithLease(grant)),
		}
		if waiterKey != "" {
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(waiterKey), "=", waiterRev))
			then = append(then, clientv3.OpDelete(waiterKey))
		}
		then = append(then, clientv3.OpGet(s.k.waiters(d.Resource), clientv3.WithPrefix(), clientv3.WithCountOnly()))
		cctx, done = s.call(ctx)
		start := time.Now()
		tresp, err := s.cli.Txn(cctx).If(conds...).Then(then...).Commit()
		done()
		if err != nil {
			return leasecore.Grant{}, s.unreachable(ctx, "reserve", s.k.live(d.Resource), err, true)
		}
		s.seeRev(tresp.Header.Revision)
		if !tresp.Succeeded {
			if waiterKey != "" {
				if ok, err := s.exists(ctx, waiterKey, waiterRev); err != nil {
					return leasecore.Grant{}, err
				} else if !ok {
					return leasecore.Grant{}, errWaiterGone
				}
			}
			continue
		}
		s.committed(start)
		// The generation is the revision of this transaction.
		l.Generation = uint64(tresp.Header.Revision)
		r := &rec{l: l, hash: hash, duration: s.opts.LeaseDuration}
		s.mu.Lock()
		s.remember(r)
		waiters := tresp.Responses[len(tresp.Responses)-1].GetResponseRange().Count
		s.fill(&l, s.opts.LeaseDuration)
		l.Waiters = int(waiters)
		s.mu.Unlock()
		if l.Mode == leasecore.ModeHandle {
			s.keepAlive(l.ID, grant, grantSent, grantTTL)
		}
		grant = 0 // now the lease's
		return leasecore.Grant{Lease: l, Token: token}, nil
	}
	return leasecore.Grant{}, s.tooBusy(s.k.live(d.Resource))
}

// errWaiterGone: an Acquire's waiter key vanished (its session lease
// expired while the cluster was unreachable); it queues again.
var errWaiterGone = errors.New("etcdstore: waiter key gone")

func (s *Store) tooBusy(key string) error {
	return &leasecore.PersistError{Op: "etcd txn", Path: key,
		Err: fmt.Errorf("%w: still racing other changes after %d tries", leasecore.ErrOutcomeUnknown, maxRetries)}
}

// exists reports whether key exists with create revision rev.
func (s *Store) exists(ctx context.Context, key string, rev int64) (bool, error) {
	cctx, done := s.call(ctx)
	resp, err := s.cli.Get(cctx, key)
	done()
	if err != nil {
		return false, s.unreachable(ctx, "read", key, err, false)
	}
	return len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == rev, nil
}

// endDeadOf ends the dead leases of uid (the quota of docs/PROTOCOL.md §7
// counts live ones) and reports whether it ended any.
func (s *Store) endDeadOf(ctx context.Context, uid uint32) (bool, error) {
	cctx, done := s.call(ctx)
	resp, err := s.cli.Get(cctx, s.k.holders(uid), clientv3.WithPrefix())
	done()
	if err != nil {
		return false, s.unreachable(ctx, "read", s.k.holders(uid), err, false)
	}
	freed := false
	for _, kv := range resp.Kvs {
		resource := strings.TrimPrefix(string(kv.Key), s.k.holders(uid))
		r, err := s.getLive(ctx, resource)
		if err != nil {
			return freed, err
		}
		if r == nil || r.l.ID != string(kv.Value) {
			freed = true // ended since it was counted
			continue
		}
		s.mu.Lock()
		dead := s.deadReason(r)
		s.mu.Unlock()
		if dead == "" {
			continue
		}
		if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err == nil {
			s.logEnd(r.l, dead)
			freed = true
		} else if errors.Is(err, errRaced) {
			freed = true
		} else {
			return freed, err
		}
	}
	return freed, nil
}

// getLive reads the live key of resource; nil when there is none.
func (s *Store) getLive(ctx context.Context, resource string) (*rec, error) {
	cctx, done := s.call(ctx)
	resp, err := s.cli.Get(cctx, s.k.live(resource))
	done()
	if err != nil {
		return nil, s.unreachable(ctx, "read", s.k.live(resource), err, false)
	}
	s.seeRev(resp.Header.Revision)
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return s.decode(resp.Kvs[0], true)
}

func (s *Store) logEnd(l leasecore.Lease, reason string) {
	s.opts.Logger.Info("lease ended", "resource", l.Resource, "lease", l.ID,
		"generation", l.Generation, "status", leasecore.StatusAbandoned, "reason", reason)
}

// end ends live lease r, recording it as l with status, in one
// transaction that succeeds only if the live key is still r's: delete the
// live, id and holder keys, write the history record; then revoke the etcd
// lease. Errors: errRaced, *PersistError.
func (s *Store) end(ctx context.Context, r *rec, l leasecore.Lease, status leasecore.Status, change string) (leasecore.Lease, error) {
	l.Status = status
	l.CompletedAt = s.opts.Clock.Now().UTC()
	l.ExpiresAt, l.Waiters = time.Time{}, 0
	cctx, done := s.call(ctx)
	start := time.Now()
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.ModRevision(s.k.live(r.l.Resource)), "=", r.kv.ModRevision)).
		Then(
			clientv3.OpDelete(s.k.live(r.l.Resource)),
			clientv3.OpDelete(s.k.id(r.l.ID)),
			clientv3.OpDelete(s.k.holder(r.l.HolderUID, r.l.Resource)),
			clientv3.OpPut(s.k.history(r.l.ID), s.encode(l, r.hash, change, r.duration)),
		).Commit()
	done()
	if err != nil {
		s.mu.Lock()
		_, keptAlive := s.handles[r.l.ID]
		s.mu.Unlock()
		if keptAlive {
			// Whether or not the transaction applied, this store must
			// stop keeping the lease alive: its holder has let go, and a
			// lease nobody holds would otherwise keep its name (and its
			// waiters waiting) until the daemon stops. Revoking ends it
			// at once if the cluster answers, else etcd ends it after
			// its TTL; the watch then records it in the history.
			s.stopKeepAlive(r.l.ID)
			s.revoke(clientv3.LeaseID(r.kv.Lease))
		}
		return leasecore.Lease{}, s.unreachable(ctx, "end", s.k.live(r.l.Resource), err, true)
	}
	s.seeRev(resp.Header.Revision)
	if !resp.Succeeded {
		return leasecore.Lease{}, errRaced
	}
	s.committed(start)
	s.stopKeepAlive(r.l.ID)
	s.revoke(clientv3.LeaseID(r.kv.Lease))
	s.mu.Lock()
	s.ended++
	s.mu.Unlock()
	return l, nil
}

// revoke revokes etcd lease id in the background (bounded by the call
// timeout); a failure leaves it to expire by its TTL.
func (s *Store) revoke(id clientv3.LeaseID) {
	if id == 0 {
		return
	}
	s.wg.Go(func() {
		ctx, done := s.call(context.Background())
		defer done()
		if _, err := s.cli.Revoke(ctx, id); err != nil && !isLeaseGone(err) {
			s.opts.Logger.Debug("revoking an etcd lease failed; it expires by its TTL", "etcd_lease", int64(id), "err", err)
		}
	})
}

// byID is what a read by lease id found.
type byID struct {
	live    *rec // the live lease, when id is live
	waiters int64
	ended   *leasecore.Lease // the ended lease, when id has ended
}

// lookup reads lease id: its live key and its history record in one
// transaction when the store knows its resource (one round trip), after
// reading its id key otherwise (two). Errors: ErrInvalidID, ErrNotFound,
// *PersistError.
func (s *Store) lookup(ctx context.Context, id string) (byID, error) {
	if err := leasecore.ValidateLeaseID(id); err != nil {
		return byID{}, err
	}
	for {
		found, again, err := s.lookupOnce(ctx, id)
		if again {
			// Its history record was written between the read and now:
			// read again, by id.
			found, _, err = s.lookupOnce(ctx, id)
		}
		var pe *leasecore.PersistError
		if err == nil || !errors.As(err, &pe) {
			return found, err
		}
		// The cluster failed fast (a reset connection) while id is a
		// handle lease this store keeps alive and its local deadline is
		// ahead: read again until it answers or the deadline ends the
		// lease, so that the holder sees its lease or ESTALE, not EIO
		// (docs/PROTOCOL.md §8a).
		s.mu.Lock()
		h := s.handles[id]
		var left time.Duration
		if h != nil {
			left = time.Until(h.deadline)
		}
		s.mu.Unlock()
		if left <= 0 {
			return found, err
		}
		t := time.NewTimer(min(left, 50*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return byID{}, ctx.Err()
		case <-s.bg.Done():
			t.Stop()
			return found, err
		case <-t.C:
		}
	}
}

// lookupOnce is one try of lookup; again says that the lease ended while
// it read and should be read once more.
func (s *Store) lookupOnce(ctx context.Context, id string) (found byID, again bool, err error) {
	s.pastDeadline(id)
	s.mu.Lock()
	k := s.known[id]
	var resource string
	wasKnown := k != nil
	if k != nil {
		resource = k.resource
	}
	s.mu.Unlock()
	if lost := s.lostLease(id); lost != nil {
		return byID{ended: lost}, false, nil
	}
	// A failed read of a handle lease this store keeps alive, cut short
	// by its local deadline, answers from local knowledge: it has ended.
	failed := func(err error) (byID, bool, error) {
		s.pastDeadline(id)
		if lost := s.lostLease(id); lost != nil {
			return byID{ended: lost}, false, nil
		}
		return byID{}, false, err
	}
	if resource == "" {
		cctx, done := s.callFor(ctx, id)
		resp, err := s.cli.Txn(cctx).Then(clientv3.OpGet(s.k.id(id)), clientv3.OpGet(s.k.history(id))).Commit()
		done()
		if err != nil {
			return failed(s.unreachable(ctx, "read", s.k.id(id), err, false))
		}
		s.seeRev(resp.Header.Revision)
		if h := resp.Responses[1].GetResponseRange().Kvs; len(h) > 0 {
			if r, err := s.decode(h[0], false); err == nil {
				return byID{ended: &r.l}, false, nil
			}
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return byID{}, false, fmt.Errorf("%w: lease %s", leasecore.ErrNotFound, id)
		}
		resource = string(kvs[0].Value)
	}
	cctx, done := s.callFor(ctx, id)
	resp, err := s.cli.Txn(cctx).Then(
		clientv3.OpGet(s.k.live(resource)),
		clientv3.OpGet(s.k.history(id)),
		clientv3.OpGet(s.k.waiters(resource), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	done()
	if err != nil {
		return failed(s.unreachable(ctx, "read", s.k.live(resource), err, false))
	}
	s.seeRev(resp.Header.Revision)
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if r, err := s.decode(kvs[0], true); err == nil && r.l.ID == id {
			return byID{live: r, waiters: resp.Responses[2].GetResponseRange().Count}, false, nil
		}
	}
	if h := resp.Responses[1].GetResponseRange().Kvs; len(h) > 0 {
		if r, err := s.decode(h[0], false); err == nil {
			return byID{ended: &r.l}, false, nil
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.known[id]; k != nil {
		// Its etcd lease expired and no history is written yet.
		l := k.last
		l.Status, l.ExpiresAt = leasecore.StatusAbandoned, time.Time{}
		if l.CompletedAt.IsZero() {
			l.CompletedAt = s.opts.Clock.Now().UTC()
		}
		return byID{ended: &l}, false, nil
	}
	// Known when the read began and forgotten since: its history is
	// written now.
	return byID{}, wasKnown, fmt.Errorf("%w: lease %s", leasecore.ErrNotFound, id)
}

// lostLease returns lease id as this store recorded it when it ended the
// lease on its own (its keep-alive unconfirmed past the local deadline),
// or nil.
func (s *Store) lostLease(id string) *leasecore.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.known[id]
	if k == nil || !k.lost {
		return nil
	}
	l := k.last
	l.Status, l.ExpiresAt = leasecore.StatusAbandoned, time.Time{}
	return &l
}

// mutate runs change on live lease id after checking token when given, and
// writes the lease it returns with a compare on the key's mod revision,
// retrying when another change came first. A lease dead by the liveness
// rules is ended first (ErrInactive). With end set, change's lease is
// ended with endStatus instead of written.
func (s *Store) mutate(ctx context.Context, id string, token *string, what string, endStatus leasecore.Status,
	change func(l *leasecore.Lease) (skip bool, err error)) (leasecore.Lease, *rec, error) {
	if err := s.begin(true); err != nil {
		return leasecore.Lease{}, nil, err
	}
	for range maxRetries {
		found, err := s.lookup(ctx, id)
		if err != nil {
			return leasecore.Lease{}, nil, err
		}
		if found.live == nil {
			return leasecore.Lease{}, nil, fmt.Errorf("%w: lease %s is %s", leasecore.ErrInactive, id, found.ended.Status)
		}
		r := found.live
		s.mu.Lock()
		dead := s.deadReason(r)
		s.mu.Unlock()
		if dead != "" {
			if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err != nil && !errors.Is(err, errRaced) {
				return leasecore.Lease{}, nil, err
			} else if err == nil {
				s.logEnd(r.l, dead)
			}
			return leasecore.Lease{}, nil, fmt.Errorf("%w: lease %s is %s", leasecore.ErrInactive, id, leasecore.StatusAbandoned)
		}
		if token != nil && !leasecore.TokenMatches(*token, r.hash) {
			return leasecore.Lease{}, nil, fmt.Errorf("%w: lease %s", leasecore.ErrTokenMismatch, id)
		}
		l := r.l
		skip, err := change(&l)
		if err != nil {
			return leasecore.Lease{}, nil, err
		}
		if skip {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.snapshot(r, found.waiters), r, nil
		}
		if endStatus != "" {
			ended, err := s.end(ctx, r, l, endStatus, what)
			if errors.Is(err, errRaced) {
				continue
			}
			if err != nil {
				return leasecore.Lease{}, nil, err
			}
			return ended, r, nil
		}
		cctx, done := s.call(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(cctx).
			If(clientv3.Compare(clientv3.ModRevision(s.k.live(r.l.Resource)), "=", r.kv.ModRevision)).
			Then(clientv3.OpPut(s.k.live(r.l.Resource), s.encode(l, r.hash, what, s.durationOf(r)), clientv3.WithLease(clientv3.LeaseID(r.kv.Lease)))).
			Commit()
		done()
		if err != nil {
			if isLeaseGone(err) {
				return leasecore.Lease{}, nil, fmt.Errorf("%w: lease %s has expired", leasecore.ErrInactive, id)
			}
			return leasecore.Lease{}, nil, s.unreachable(ctx, what, s.k.live(r.l.Resource), err, true)
		}
		s.seeRev(resp.Header.Revision)
		if !resp.Succeeded {
			continue
		}
		s.committed(start)
		nr := &rec{l: l, hash: r.hash, duration: s.durationOf(r), kv: r.kv}
		s.mu.Lock()
		s.remember(nr)
		out := s.snapshot(nr, found.waiters)
		s.mu.Unlock()
		return out, r, nil
	}
	return leasecore.Lease{}, nil, s.tooBusy(id)
}

// Renew authenticates token and moves the heartbeat of lease id to now,
// applying ann; see [leasecore.Store.Renew]. It also keeps the lease's etcd
// lease alive. Round trips: a read, the compare-and-swap transaction and a
// keep-alive (three).
func (s *Store) Renew(ctx context.Context, id, token string, ann leasecore.Annotations) (leasecore.Lease, error) {
	l, r, err := s.mutate(ctx, id, &token, chRenewed, "", func(l *leasecore.Lease) (bool, error) {
		if err := leasecore.ApplyAnnotations(l, ann); err != nil {
			return false, err
		}
		l.HeartbeatAt = s.opts.Clock.Now().UTC()
		return false, nil
	})
	if err != nil {
		return l, err
	}
	cctx, done := s.call(ctx)
	_, err = s.cli.KeepAliveOnce(cctx, clientv3.LeaseID(r.kv.Lease))
	done()
	switch {
	case err != nil && isLeaseGone(err):
		return leasecore.Lease{}, fmt.Errorf("%w: lease %s has expired", leasecore.ErrInactive, id)
	case err != nil:
		return leasecore.Lease{}, s.unreachable(ctx, "keep-alive", s.k.live(l.Resource), err, true)
	}
	return l, nil
}

// Release authenticates token, applies ann and ends lease id with status;
// see [leasecore.Store.Release]. Round trips: a read and the ending
// transaction (two); the revoke follows in the background.
func (s *Store) Release(ctx context.Context, id, token string, status leasecore.Status, ann leasecore.Annotations) (leasecore.Lease, error) {
	if err := leasecore.CheckEndStatus(status); err != nil {
		return leasecore.Lease{}, err
	}
	l, _, err := s.mutate(ctx, id, &token, chReleased, status, func(l *leasecore.Lease) (bool, error) {
		return false, leasecore.ApplyAnnotations(l, ann)
	})
	return l, err
}

// End ends lease id with status without a token; see
// [leasecore.Store.End]. Round trips as Release.
func (s *Store) End(ctx context.Context, id string, status leasecore.Status) (leasecore.Lease, error) {
	if err := leasecore.CheckEndStatus(status); err != nil {
		return leasecore.Lease{}, err
	}
	l, _, err := s.mutate(ctx, id, nil, chReleased, status, func(*leasecore.Lease) (bool, error) { return false, nil })
	return l, err
}

// Bind turns live lease id into a handle lease, which this store then
// keeps alive (keep-alives of its etcd lease, see [Store.keepAlive]) until
// it ends; see [leasecore.Store.Bind]. Round trips: a read, the
// compare-and-swap transaction and a first keep-alive (three).
func (s *Store) Bind(ctx context.Context, id string, holderPID int) (leasecore.Lease, error) {
	l, r, err := s.mutate(ctx, id, nil, chBound, "", func(l *leasecore.Lease) (bool, error) {
		if l.Mode == leasecore.ModeHandle && (holderPID <= 0 || holderPID == l.HolderPID) {
			return true, nil
		}
		l.Mode = leasecore.ModeHandle
		if holderPID > 0 {
			l.HolderPID = holderPID
		}
		return false, nil
	})
	if err != nil {
		return l, err
	}
	s.mu.Lock()
	h := s.handles[id]
	if h != nil && h.previous != "" {
		h.previous = "" // bound to an open file of this daemon now
		l.Daemon, l.HolderPIDs = "", ""
	}
	s.mu.Unlock()
	if h != nil {
		return l, nil
	}
	// The lease's etcd TTL may have been counting since its last renewal:
	// a keep-alive answered now gives the local deadline its start
	// (docs/PROTOCOL.md §8a), before the lock is granted.
	lid := clientv3.LeaseID(r.kv.Lease)
	cctx, done := s.call(ctx)
	sent := time.Now()
	resp, err := s.cli.KeepAliveOnce(cctx, lid)
	done()
	switch {
	case err == nil && resp.TTL > 0:
		s.keepAlive(id, lid, sent, time.Duration(resp.TTL)*time.Second)
		return l, nil
	case err == nil || isLeaseGone(err):
		return leasecore.Lease{}, fmt.Errorf("%w: lease %s has expired", leasecore.ErrInactive, id)
	}
	// Unconfirmed: the lease is ended for this store at once (and its key
	// removed once the cluster answers).
	s.lost(id)
	return leasecore.Lease{}, s.unreachable(ctx, "keep-alive", s.k.live(l.Resource), err, true)
}

// RequestTakeover records req on live lease id; see
// [leasecore.Store.RequestTakeover]. Round trips: two.
func (s *Store) RequestTakeover(ctx context.Context, id string, req leasecore.TakeoverRequest) (leasecore.Lease, error) {
	for _, text := range []string{req.By, req.Reason} {
		if err := leasecore.CheckText(text); err != nil {
			return leasecore.Lease{}, err
		}
	}
	l, _, err := s.mutate(ctx, id, nil, chTakeover, "", func(l *leasecore.Lease) (bool, error) {
		l.TakeoverRequestedBy = req.By
		l.TakeoverRequestedAt = s.opts.Clock.Now().UTC()
		l.TakeoverReason = req.Reason
		return false, nil
	})
	return l, err
}

// Live returns the live lease on resource; see [leasecore.Store.Live].
// One round trip.
func (s *Store) Live(ctx context.Context, resource string) (leasecore.Lease, error) {
	if err := s.begin(false); err != nil {
		return leasecore.Lease{}, err
	}
	cctx, done := s.call(ctx)
	resp, err := s.cli.Txn(cctx).Then(
		clientv3.OpGet(s.k.live(resource)),
		clientv3.OpGet(s.k.waiters(resource), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	done()
	if err != nil {
		return leasecore.Lease{}, s.unreachable(ctx, "read", s.k.live(resource), err, false)
	}
	s.seeRev(resp.Header.Revision)
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if r, err := s.decode(kvs[0], true); err == nil {
			s.mu.Lock()
			l := s.snapshot(r, resp.Responses[1].GetResponseRange().Count)
			s.mu.Unlock()
			if l.Live() {
				return l, nil
			}
		}
	}
	return leasecore.Lease{}, fmt.Errorf("%w: no live lease on %q", leasecore.ErrNotFound, resource)
}

// Load returns lease id in any status; see [leasecore.Store.Load]. One
// round trip when the store has seen the lease, two otherwise.
func (s *Store) Load(ctx context.Context, id string) (leasecore.Lease, error) {
	if err := s.begin(false); err != nil {
		return leasecore.Lease{}, err
	}
	found, err := s.lookup(ctx, id)
	if err != nil {
		return leasecore.Lease{}, err
	}
	if found.ended != nil {
		return *found.ended, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshot(found.live, found.waiters), nil
}

// listLive reads the live leases under prefix and the waiter keys in one
// transaction and returns the live ones accepted by keep, sorted by
// resource.
func (s *Store) listLive(ctx context.Context, prefix string, extra []clientv3.Op, keep func(leasecore.Lease) bool) ([]leasecore.Lease, *clientv3.TxnResponse, error) {
	if err := s.begin(false); err != nil {
		return nil, nil, err
	}
	ops := append([]clientv3.Op{
		clientv3.OpGet(prefix, clientv3.WithPrefix()),
		clientv3.OpGet(s.k.waitersAll(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	}, extra...)
	cctx, done := s.call(ctx)
	resp, err := s.cli.Txn(cctx).Then(ops...).Commit()
	done()
	if err != nil {
		return nil, nil, s.unreachable(ctx, "read", prefix, err, false)
	}
	s.seeRev(resp.Header.Revision)
	waiters := make(map[string]int64)
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		_, r := s.k.classify(string(kv.Key))
		waiters[r]++
	}
	var out []leasecore.Lease
	s.mu.Lock()
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		r, err := s.decode(kv, true)
		if err != nil {
			continue
		}
		if l := s.snapshot(r, waiters[r.l.Resource]); l.Live() && keep(l) {
			out = append(out, l)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b leasecore.Lease) int { return strings.Compare(a.Resource, b.Resource) })
	return out, resp, nil
}

// List returns every live lease sorted by resource; see
// [leasecore.Store.List]. One round trip.
func (s *Store) List(ctx context.Context) ([]leasecore.Lease, error) {
	out, _, err := s.listLive(ctx, s.k.livePrefix(""), nil, func(leasecore.Lease) bool { return true })
	return out, err
}

// ListDir returns the namespaces and live leases directly inside dir; see
// [leasecore.Store.ListDir]. One round trip.
func (s *Store) ListDir(ctx context.Context, dir string) ([]leasecore.Namespace, []leasecore.Lease, error) {
	extra := []clientv3.Op{clientv3.OpGet(s.k.nsPrefix(dir), clientv3.WithPrefix())}
	if dir != "" {
		extra = append(extra, clientv3.OpGet(s.k.ns(dir), clientv3.WithCountOnly()))
	}
	leases, resp, err := s.listLive(ctx, s.k.livePrefix(dir), extra,
		func(l leasecore.Lease) bool { return leasecore.ParentOf(l.Resource) == dir })
	if err != nil {
		return nil, nil, err
	}
	if dir != "" && resp.Responses[3].GetResponseRange().Count == 0 {
		return nil, nil, fmt.Errorf("%w: %q", leasecore.ErrNoNamespace, dir)
	}
	var nss []leasecore.Namespace
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		path := strings.TrimPrefix(string(kv.Key), s.k.ns(""))
		if leasecore.ParentOf(path) == dir {
			nss = append(nss, decodeNS(path, kv.Value))
		}
	}
	slices.SortFunc(nss, func(a, b leasecore.Namespace) int { return strings.Compare(a.Path, b.Path) })
	return nss, leases, nil
}

// History returns ended leases newest first; see [leasecore.Store.History].
// One round trip, reading every history record.
func (s *Store) History(ctx context.Context, resource string) ([]leasecore.Lease, error) {
	if err := s.begin(false); err != nil {
		return nil, err
	}
	cctx, done := s.call(ctx)
	resp, err := s.cli.Get(cctx, s.k.historyPrefix(), clientv3.WithPrefix())
	done()
	if err != nil {
		return nil, s.unreachable(ctx, "read", s.k.historyPrefix(), err, false)
	}
	var out []leasecore.Lease
	for _, kv := range resp.Kvs {
		r, err := s.decode(kv, false)
		if err != nil || r.l.Status == leasecore.StatusActive || resource != "" && r.l.Resource != resource {
			continue
		}
		out = append(out, r.l)
	}
	slices.SortFunc(out, func(a, b leasecore.Lease) int {
		return cmp.Or(b.CompletedAt.Compare(a.CompletedAt), cmp.Compare(b.Generation, a.Generation))
	})
	return out, nil
}

// Namespace returns the namespace at path; see [leasecore.Store.Namespace].
func (s *Store) Namespace(ctx context.Context, path string) (leasecore.Namespace, error) {
	if err := s.begin(false); err != nil {
		return leasecore.Namespace{}, err
	}
	cctx, done := s.call(ctx)
	resp, err := s.cli.Get(cctx, s.k.ns(path))
	done()
	if err != nil {
		return leasecore.Namespace{}, s.unreachable(ctx, "read", s.k.ns(path), err, false)
	}
	if path == "" || len(resp.Kvs) == 0 {
		return leasecore.Namespace{}, fmt.Errorf("%w: namespace %q", leasecore.ErrNotFound, path)
	}
	return decodeNS(path, resp.Kvs[0].Value), nil
}

// Mkdir creates namespace path; see [leasecore.Store.Mkdir]. A uid may own
// at most MaxLeasesPerUID namespaces (ErrQuota).
func (s *Store) Mkdir(ctx context.Context, path string, uid, gid uint32) (leasecore.Namespace, error) {
	if err := leasecore.ValidateResource(path); err != nil {
		return leasecore.Namespace{}, err
	}
	if err := s.begin(true); err != nil {
		return leasecore.Namespace{}, err
	}
	parent := leasecore.ParentOf(path)
	for range maxRetries {
		ops := []clientv3.Op{
			clientv3.OpGet(s.k.ns(path), clientv3.WithCountOnly()),
			clientv3.OpGet(s.k.live(path)),
			clientv3.OpGet(s.k.nsOwners(uid), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		}
		if parent != "" {
			ops = append(ops, clientv3.OpGet(s.k.ns(parent), clientv3.WithCountOnly()))
		}
		cctx, done := s.call(ctx)
		resp, err := s.cli.Txn(cctx).Then(ops...).Commit()
		done()
		if err != nil {
			return leasecore.Namespace{}, s.unreachable(ctx, "read", s.k.ns(path), err, false)
		}
		rs := resp.Responses
		switch {
		case parent != "" && rs[3].GetResponseRange().Count == 0:
			return leasecore.Namespace{}, fmt.Errorf("%w: %q", leasecore.ErrNoNamespace, parent)
		case rs[0].GetResponseRange().Count > 0:
			return leasecore.Namespace{}, fmt.Errorf("%w: namespace %q", leasecore.ErrExists, path)
		case rs[2].GetResponseRange().Count >= int64(s.opts.MaxLeasesPerUID):
			return leasecore.Namespace{}, fmt.Errorf("%w: uid %d owns %d namespaces", leasecore.ErrQuota, uid, rs[2].GetResponseRange().Count)
		}
		if kvs := rs[1].GetResponseRange().Kvs; len(kvs) > 0 {
			r, err := s.decode(kvs[0], true)
			if err != nil {
				return leasecore.Namespace{}, fmt.Errorf("%w: %q is a lease", leasecore.ErrExists, path)
			}
			s.mu.Lock()
			dead := s.deadReason(r)
			s.mu.Unlock()
			if dead == "" {
				return leasecore.Namespace{}, fmt.Errorf("%w: %q is a live lease", leasecore.ErrExists, path)
			}
			if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err != nil && !errors.Is(err, errRaced) {
				return leasecore.Namespace{}, err
			}
			continue
		}
		ns := leasecore.Namespace{Path: path, UID: uid, GID: gid, CreatedAt: s.opts.Clock.Now().UTC().Truncate(time.Millisecond)}
		v, _ := json.Marshal(nsValue{UID: uid, GID: gid, CreatedAt: ns.CreatedAt})
		conds := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(s.k.ns(path)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.k.live(path)), "=", 0),
			clientv3.Compare(clientv3.ModRevision(s.k.nsOwners(uid)), "<", resp.Header.Revision+1).WithPrefix(),
		}
		if parent != "" {
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(s.k.ns(parent)), ">", 0))
		}
		cctx, done = s.call(ctx)
		start := time.Now()
		tresp, err := s.cli.Txn(cctx).If(conds...).Then(
			clientv3.OpPut(s.k.ns(path), string(v)),
			clientv3.OpPut(s.k.nsOwner(uid, path), ""),
		).Commit()
		done()
		if err != nil {
			return leasecore.Namespace{}, s.unreachable(ctx, "mkdir", s.k.ns(path), err, true)
		}
		if tresp.Succeeded {
			s.committed(start)
			return ns, nil
		}
	}
	return leasecore.Namespace{}, s.tooBusy(s.k.ns(path))
}

// Rmdir removes an empty namespace; see [leasecore.Store.Rmdir]. The
// transaction succeeds only while no live lease and no namespace is under
// path.
func (s *Store) Rmdir(ctx context.Context, path string) error {
	if err := s.begin(true); err != nil {
		return err
	}
	if path == "" {
		return fmt.Errorf("%w: namespace %q", leasecore.ErrNotFound, path)
	}
	for range maxRetries {
		cctx, done := s.call(ctx)
		resp, err := s.cli.Txn(cctx).Then(
			clientv3.OpGet(s.k.ns(path)),
			clientv3.OpGet(s.k.nsPrefix(path), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
			clientv3.OpGet(s.k.livePrefix(path), clientv3.WithPrefix()),
		).Commit()
		done()
		if err != nil {
			return s.unreachable(ctx, "read", s.k.ns(path), err, false)
		}
		rs := resp.Responses
		nsKVs := rs[0].GetResponseRange().Kvs
		if len(nsKVs) == 0 {
			return fmt.Errorf("%w: namespace %q", leasecore.ErrNotFound, path)
		}
		if kvs := rs[1].GetResponseRange().Kvs; len(kvs) > 0 {
			return fmt.Errorf("%w: %q holds namespace %q", leasecore.ErrNotEmpty, path, strings.TrimPrefix(string(kvs[0].Key), s.k.ns("")))
		}
		ended := false
		for _, kv := range rs[2].GetResponseRange().Kvs {
			r, err := s.decode(kv, true)
			if err != nil {
				continue
			}
			s.mu.Lock()
			dead := s.deadReason(r)
			s.mu.Unlock()
			if dead == "" {
				return fmt.Errorf("%w: %q holds live lease %q", leasecore.ErrNotEmpty, path, r.l.Resource)
			}
			if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err != nil && !errors.Is(err, errRaced) {
				return err
			}
			ended = true
		}
		if ended {
			continue
		}
		owner := decodeNS(path, nsKVs[0].Value).UID
		cctx, done = s.call(ctx)
		start := time.Now()
		tresp, err := s.cli.Txn(cctx).If(
			clientv3.Compare(clientv3.ModRevision(s.k.ns(path)), "=", nsKVs[0].ModRevision),
			clientv3.Compare(clientv3.CreateRevision(s.k.nsPrefix(path)), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(s.k.livePrefix(path)), "=", 0).WithPrefix(),
		).Then(clientv3.OpDelete(s.k.ns(path)), clientv3.OpDelete(s.k.nsOwner(owner, path))).Commit()
		done()
		if err != nil {
			return s.unreachable(ctx, "rmdir", s.k.ns(path), err, true)
		}
		if tresp.Succeeded {
			s.committed(start)
			return nil
		}
	}
	return s.tooBusy(s.k.ns(path))
}

// committed reports one change that the cluster made durable to
// Options.OnCommit: start is when the transaction that made it was sent
// (etcd answers a write once its WAL entry is synced on a quorum).
func (s *Store) committed(start time.Time) {
	if s.opts.OnCommit != nil {
		s.opts.OnCommit(time.Since(start))
	}
}
