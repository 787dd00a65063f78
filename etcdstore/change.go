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

// Every change to a live lease is one transaction that compares the live
// key's mod revision with the version this store acts on and reads the key
// in its Else branch, so that a change that lost a race retries with what
// it read instead of reading again (docs/PROTOCOL.md §8a). The version it
// acts on is what the store last learned of the lease (its own
// transactions, its watch, its reads): no read precedes a change.

func (s *Store) logEnd(l leasecore.Lease, reason string) {
	s.opts.Logger.Debug("lease ended", "resource", l.Resource, "lease", l.ID,
		"generation", l.Generation, "status", leasecore.StatusAbandoned, "reason", reason)
}

// raced records what the Else branch of a failed compare on r's live key
// read (kvs: the key, or nothing when it is gone at revision rev) and
// returns errRaced.
func (s *Store) raced(r *rec, kvs []*mvccpb.KeyValue, rev int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(kvs) == 0 {
		s.dropLive(r.l.Resource, rev)
		return errRaced
	}
	if cur, err := s.decode(kvs[0], true); err == nil {
		s.learnLive(cur, rev)
	}
	return errRaced
}

// end ends live lease r, recording it as l with status, in one
// transaction that succeeds only if the live key is still r's: delete the
// live and id keys, write the history record. Errors: errRaced (the store
// now knows the key's current version), *PersistError.
func (s *Store) end(ctx context.Context, r *rec, l leasecore.Lease, status leasecore.Status, change string) (leasecore.Lease, error) {
	l.Status = status
	l.CompletedAt = s.opts.Clock.Now().UTC()
	l.ExpiresAt, l.Waiters = time.Time{}, 0
	live := s.k.live(r.l.Resource)
	// This call publishes the end, which it knows how it came about; the
	// name's watch skips it (see [Store.writeBegin]).
	s.writeBegin(r.l.Resource)
	var made int64
	defer func() { s.writeDone(r.l.Resource, made) }()
	cctx, done := s.call(ctx)
	start := time.Now()
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.ModRevision(live), "=", r.kv.ModRevision)).
		Then(
			clientv3.OpDelete(live),
			clientv3.OpDelete(s.k.id(r.l.ID)),
			// The quota's holder key (reserve.go).
			clientv3.OpDelete(s.k.holder(r.l.HolderUID, r.l.Resource)),
			clientv3.OpPut(s.k.history(r.l.ID), s.encode(l, r.hash, change, r.duration)),
		).
		Else(clientv3.OpGet(live)).
		Commit()
	done()
	if err != nil {
		if s.OwnsHandle(r.l.ID) {
			// Whether or not the transaction applied, the holder has let
			// go: this store stops counting the lease as its own and
			// removes the key once the cluster answers, since its handle
			// session would otherwise keep the name (and its waiters
			// waiting) until the daemon stops.
			s.stopKeepAlive(r.l.ID)
			s.removeLater(l)
		}
		return leasecore.Lease{}, s.unreachable(ctx, "end", live, err, true)
	}
	s.seeRev(resp.Header.Revision)
	if !resp.Succeeded {
		return leasecore.Lease{}, s.raced(r, resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision)
	}
	s.committed(start)
	s.stopKeepAlive(r.l.ID)
	rev := resp.Header.Revision
	made = rev
	s.mu.Lock()
	s.dropLive(r.l.Resource, rev)
	s.sawLive(r.l.Resource, rev)
	s.ended++
	k := s.known[r.l.ID]
	if k != nil {
		k.last, k.goneAt, k.recorded = l, time.Now(), true
	}
	if k == nil || !k.lost && !k.published {
		if k != nil {
			k.published = true
		}
		s.feed.Publish(rev, leasecore.Event{Kind: leasecore.EventEnded, Change: changeOr(change, leasecore.ChangeReleased), Lease: l})
	}
	s.mu.Unlock()
	s.notify(r.l.Resource)
	return l, nil
}

// removeLater ends lease l (recorded as abandoned) in the background once
// the cluster answers, if its live key is still l's: for a handle lease
// that ended for this store while the cluster could not be told.
func (s *Store) removeLater(l leasecore.Lease) {
	s.endLater(l.Resource, func(r *rec) (leasecore.Lease, bool) { return l, r.l.ID == l.ID }, "")
}

// endUnboundLater ends lease id of resource in the background once the
// cluster answers, if a bind whose outcome is unknown moved it onto this
// daemon's handle session: the caller was told the bind failed, so no open
// file holds it, and the session would keep it (and the name's waiters
// waiting) until the daemon stops (docs/PROTOCOL.md §8a, "Elections").
// A lease still a token lease, ended, or bound again since (this store
// owns it then) is left alone.
func (s *Store) endUnboundLater(id, resource string) {
	s.endLater(resource, func(r *rec) (leasecore.Lease, bool) {
		return r.l, r.l.ID == id && r.l.Mode == leasecore.ModeHandle && !s.OwnsHandle(id)
	}, "bound while the cluster did not answer, and held by no open file")
}

// endLater reads resource's live record once the cluster answers (trying
// every second until the store closes) and, when which accepts it, ends it
// as abandoned, recorded as the lease which returns, logging reason when
// it is not empty; a record that changed meanwhile is read again.
func (s *Store) endLater(resource string, which func(r *rec) (leasecore.Lease, bool), reason string) {
	s.wg.Go(func() {
		for s.bg.Err() == nil {
			r, err := s.getLive(background(s.bg), resource)
			if err == nil {
				l, ok := leasecore.Lease{}, false
				if r != nil {
					l, ok = which(r)
				}
				if !ok {
					return
				}
				ended, err := s.end(background(s.bg), r, l, leasecore.StatusAbandoned, chExpired)
				if errors.Is(err, errRaced) {
					continue
				}
				if err == nil {
					if reason != "" {
						s.logEnd(ended, reason)
					}
					return
				}
			}
			if !s.sleep(time.Second) {
				return
			}
		}
	})
}

// put writes l, with the change that made it, as the live lease of r's
// resource on etcd lease lid, if the key is still at r's version.
// Errors: errRaced (the store now knows the key's current version, or lid
// was a bucket or session the cluster no longer has), ErrInactive (r's own
// etcd lease expired), *PersistError.
func (s *Store) put(ctx context.Context, r *rec, l leasecore.Lease, change string, lid clientv3.LeaseID) (*rec, error) {
	live := s.k.live(r.l.Resource)
	value := s.encode(l, r.hash, change, s.durationOf(r))
	s.writeBegin(r.l.Resource)
	var made int64
	defer func() { s.writeDone(r.l.Resource, made) }()
	cctx, done := s.call(ctx)
	start := time.Now()
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.ModRevision(live), "=", r.kv.ModRevision)).
		Then(
			clientv3.OpPut(live, value, clientv3.WithLease(lid)),
			clientv3.OpPut(s.k.id(r.l.ID), r.l.Resource, clientv3.WithLease(lid)),
			// The quota's holder key moves with the lease (reserve.go).
			clientv3.OpPut(s.k.holder(r.l.HolderUID, r.l.Resource), r.l.ID, clientv3.WithLease(lid)),
		).
		Else(clientv3.OpGet(live)).
		Commit()
	done()
	switch {
	case err != nil && isLeaseGone(err) && int64(lid) == r.kv.Lease:
		return nil, fmt.Errorf("%w: lease %s has expired", leasecore.ErrInactive, l.ID)
	case err != nil && isLeaseGone(err):
		s.forgetLease(lid)
		return nil, errRaced
	case err != nil:
		return nil, s.unreachable(ctx, change, live, err, true)
	}
	s.seeRev(resp.Header.Revision)
	if !resp.Succeeded {
		return nil, s.raced(r, resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision)
	}
	s.committed(start)
	rev := resp.Header.Revision
	nr := &rec{l: l, hash: r.hash, change: change, daemon: s.opts.DaemonID, duration: s.durationOf(r),
		kv: &mvccpb.KeyValue{Key: []byte(live), Value: []byte(value), CreateRevision: r.kv.CreateRevision, ModRevision: rev, Lease: int64(lid)}}
	made = rev
	e := leasecore.Event{Kind: leasecore.EventChanged, Change: changeOr(change, leasecore.ChangeRenewed), Lease: l}
	s.mu.Lock()
	s.learnLive(nr, rev)
	s.sawLive(nr.l.Resource, rev)
	s.fill(&e.Lease, s.durationOf(nr))
	e.Lease.Generation = uint64(nr.kv.CreateRevision)
	s.feed.Publish(rev, e)
	s.mu.Unlock()
	s.notify(nr.l.Resource)
	return nr, nil
}

// current returns the live record of lease id as this store last learned
// it, or nil when it does not know the lease live.
func (s *Store) current(id string) *rec {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.known[id]
	if k == nil || k.lost {
		return nil
	}
	if r := s.live[k.resource]; r != nil && r.l.ID == id {
		return r
	}
	return nil
}

// mutate runs change on live lease id after checking token when given, and
// writes the lease it returns (onto the etcd lease that onto picks; nil
// keeps the lease's own) with a compare on the key's mod revision,
// retrying with what the failed compare read when another change came
// first. It acts on what the store knows of the lease and reads the lease
// only when it does not know it live. A lease dead by the liveness rules
// is ended first (ErrInactive). With endStatus set, change's lease is ended
// with endStatus instead of written.
func (s *Store) mutate(ctx context.Context, id string, token *string, what string, endStatus leasecore.Status,
	change func(l *leasecore.Lease) (skip bool, err error), onto func(r *rec) (clientv3.LeaseID, error)) (leasecore.Lease, *rec, error) {
	if err := s.begin(true); err != nil {
		return leasecore.Lease{}, nil, err
	}
	if err := leasecore.ValidateLeaseID(id); err != nil {
		return leasecore.Lease{}, nil, err
	}
	s.pastDeadline(id)
	r := s.current(id)
	for range maxRetries {
		if r == nil {
			found, err := s.lookup(ctx, id)
			if err != nil {
				return leasecore.Lease{}, nil, err
			}
			if found.live == nil {
				return leasecore.Lease{}, nil, fmt.Errorf("%w: lease %s is %s", leasecore.ErrInactive, id, found.ended.Status)
			}
			r = found.live
		}
		s.mu.Lock()
		dead := s.deadReason(r)
		s.mu.Unlock()
		if dead != "" {
			if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); errors.Is(err, errRaced) {
				r = s.current(id)
				continue
			} else if err != nil {
				return leasecore.Lease{}, nil, err
			}
			s.logEnd(r.l, dead)
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
			return s.snapshot(r, s.waitersOf(r.l.Resource)), r, nil
		}
		if endStatus != "" {
			ended, err := s.end(ctx, r, l, endStatus, what)
			if errors.Is(err, errRaced) {
				r = s.current(id)
				continue
			}
			if err != nil {
				return leasecore.Lease{}, nil, err
			}
			return ended, r, nil
		}
		lid := clientv3.LeaseID(r.kv.Lease)
		if onto != nil {
			if lid, err = onto(r); err != nil {
				return leasecore.Lease{}, nil, err
			}
		}
		nr, err := s.put(ctx, r, l, what, lid)
		if errors.Is(err, errRaced) {
			r = s.current(id)
			continue
		}
		if err != nil {
			return leasecore.Lease{}, nil, err
		}
		s.mu.Lock()
		out := s.snapshot(nr, s.waitersOf(nr.l.Resource))
		s.mu.Unlock()
		return out, nr, nil
	}
	return leasecore.Lease{}, nil, s.tooBusy(id)
}

// Renew authenticates token and moves the heartbeat of lease id to now,
// applying ann; see [leasecore.Store.Renew]. A token lease moves to the
// current bucket (see [bucket]) in the same transaction, which is what
// keeps it in the cluster: one round trip, no keep-alive.
func (s *Store) Renew(ctx context.Context, id, token string, ann leasecore.Annotations) (leasecore.Lease, error) {
	l, _, err := s.mutate(ctx, id, &token, chRenewed, "", func(l *leasecore.Lease) (bool, error) {
		if err := leasecore.ApplyAnnotations(l, ann); err != nil {
			return false, err
		}
		l.HeartbeatAt = s.opts.Clock.Now().UTC()
		return false, nil
	}, func(r *rec) (clientv3.LeaseID, error) {
		if r.l.Mode == leasecore.ModeHandle {
			return clientv3.LeaseID(r.kv.Lease), nil
		}
		return s.tokenBucket(ctx)
	})
	return l, err
}

// Release authenticates token, applies ann and ends lease id with status;
// see [leasecore.Store.Release]. One round trip: the ending transaction.
func (s *Store) Release(ctx context.Context, id, token string, status leasecore.Status, ann leasecore.Annotations) (leasecore.Lease, error) {
	if err := leasecore.CheckEndStatus(status); err != nil {
		return leasecore.Lease{}, err
	}
	l, _, err := s.mutate(ctx, id, &token, chReleased, status, func(l *leasecore.Lease) (bool, error) {
		return false, leasecore.ApplyAnnotations(l, ann)
	}, nil)
	return l, err
}

// End ends lease id with status without a token; see
// [leasecore.Store.End]. Round trips as Release.
func (s *Store) End(ctx context.Context, id string, status leasecore.Status) (leasecore.Lease, error) {
	if err := leasecore.CheckEndStatus(status); err != nil {
		return leasecore.Lease{}, err
	}
	l, _, err := s.mutate(ctx, id, nil, chReleased, status, func(*leasecore.Lease) (bool, error) { return false, nil }, nil)
	return l, err
}

// Bind turns live lease id into a handle lease on this store's handle
// session, which keeps it alive until it ends (see [hsession]); see
// [leasecore.Store.Bind]. One round trip: the transaction that moves the
// lease onto the session. Errors as mutate's; *PersistError (EIO) when the
// handle session is not confirmed.
func (s *Store) Bind(ctx context.Context, id string, holderPID int) (leasecore.Lease, error) {
	owned := s.OwnsHandle(id)
	var resource string
	if r := s.current(id); r != nil {
		resource = r.l.Resource
	}
	l, _, err := s.mutate(ctx, id, nil, chBound, "", func(l *leasecore.Lease) (bool, error) {
		if l.Mode == leasecore.ModeHandle && owned && (holderPID <= 0 || holderPID == l.HolderPID) {
			return true, nil
		}
		l.Mode = leasecore.ModeHandle
		if holderPID > 0 {
			l.HolderPID = holderPID
		}
		return false, nil
	}, func(r *rec) (clientv3.LeaseID, error) {
		lid, err := s.handleSession()
		if err != nil {
			return 0, s.unreachable(ctx, "keep-alive", s.k.live(r.l.Resource), err, false)
		}
		return lid, nil
	})
	if err != nil {
		if !owned && resource != "" && errors.Is(err, leasecore.ErrOutcomeUnknown) {
			s.endUnboundLater(id, resource)
		}
		return l, err
	}
	s.keepAlive(id)
	s.mu.Lock()
	if h := s.handles[id]; h != nil && h.previous != "" {
		h.previous = "" // bound to an open file of this daemon now
	}
	l.Daemon, l.HolderPIDs = "", ""
	s.mu.Unlock()
	return l, nil
}

// Note records the holder's note on live lease id; see
// [leasecore.Store.Note]. One round trip.
func (s *Store) Note(ctx context.Context, id, note string) (leasecore.Lease, error) {
	if err := leasecore.CheckNote(note); err != nil {
		return leasecore.Lease{}, err
	}
	l, _, err := s.mutate(ctx, id, nil, chNoted, "", func(l *leasecore.Lease) (bool, error) {
		if l.Note == note {
			return true, nil
		}
		l.Note = note
		return false, nil
	}, nil)
	return l, err
}

// RequestTakeover records req on live lease id; see
// [leasecore.Store.RequestTakeover]. One round trip.
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
	}, nil)
	return l, err
}

// committed reports one change that the cluster made durable to
// Options.OnCommit: start is when the transaction that made it was sent
// (etcd answers a write once its WAL entry is synced on a quorum).
func (s *Store) committed(start time.Time) {
	if s.opts.OnCommit != nil {
		s.opts.OnCommit(time.Since(start))
	}
}
