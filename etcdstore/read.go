package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/leasecore"
)

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
		s.mu.Lock()
		s.dropLive(resource, resp.Header.Revision+1)
		s.mu.Unlock()
		return nil, nil
	}
	r, err := s.decode(resp.Kvs[0], true)
	if err == nil {
		s.mu.Lock()
		s.learnLive(r, resp.Header.Revision)
		s.mu.Unlock()
	}
	return r, err
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
		var left time.Duration
		if d, ok := s.handleDeadline(id); ok {
			left = time.Until(d)
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
		resp, err := s.readTxn(cctx, clientv3.OpGet(s.k.id(id)), clientv3.OpGet(s.k.history(id)))
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
	resp, err := s.readTxn(cctx,
		clientv3.OpGet(s.k.live(resource)),
		clientv3.OpGet(s.k.history(id)),
		clientv3.OpGet(s.k.waiters(resource), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	)
	done()
	if err != nil {
		return failed(s.unreachable(ctx, "read", s.k.live(resource), err, false))
	}
	s.seeRev(resp.Header.Revision)
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if r, err := s.decode(kvs[0], true); err == nil {
			s.mu.Lock()
			s.learnLive(r, resp.Header.Revision)
			s.mu.Unlock()
			if r.l.ID == id {
				return byID{live: r, waiters: resp.Responses[2].GetResponseRange().Count}, false, nil
			}
		}
	}
	if h := resp.Responses[1].GetResponseRange().Kvs; len(h) > 0 {
		if r, err := s.decode(h[0], false); err == nil {
			return byID{ended: &r.l}, false, nil
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.known[id]; k != nil && !k.recorded {
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

// Live returns the live lease on resource; see [leasecore.Store.Live].
// One round trip, a linearizable read (docs/PROTOCOL.md §3: a system call
// that looks a name up sees every change committed before it began).
func (s *Store) Live(ctx context.Context, resource string) (leasecore.Lease, error) {
	_, l, err := s.ReadName(ctx, resource)
	if err != nil {
		return leasecore.Lease{}, err
	}
	if l == nil {
		return leasecore.Lease{}, fmt.Errorf("%w: no live lease on %q", leasecore.ErrNotFound, resource)
	}
	return *l, nil
}

// ReadName reads what resource names, a namespace or a live lease, in one
// round trip: the linearizable read of a LOOKUP (docs/PROTOCOL.md §3), whose
// result the requests that follow it answer from. It returns a nil
// namespace and lease when the name is free; see [leasecore.NameReader].
// Errors: ErrClosed, *PersistError (EIO).
func (s *Store) ReadName(ctx context.Context, resource string) (*leasecore.Namespace, *leasecore.Lease, error) {
	if err := s.begin(false); err != nil {
		return nil, nil, err
	}
	if ns, ok := s.cachedNS(resource); ok {
		// A namespace is answered from what this store learned: one
		// removed elsewhere fails the change that depends on it
		// (docs/PROTOCOL.md §8a, "Namespaces").
		return &ns, nil, nil
	}
	cctx, done := s.call(ctx)
	resp, err := s.readTxn(cctx,
		clientv3.OpGet(s.k.live(resource)),
		// The keys, not a count: the store follows the name from this
		// read (see [Store.observe]).
		s.waiterKeys(resource),
		clientv3.OpGet(s.k.ns(resource)),
	)
	done()
	if err != nil {
		if l := s.ownHandleOf(resource); l != nil {
			// A handle lease this store keeps alive, before its local end
			// (in jeopardy, say): no other mount can hold the name yet, so
			// the store's own view answers (docs/PROTOCOL.md §8a).
			return nil, l, nil
		}
		return nil, nil, s.unreachable(ctx, "read", s.k.live(resource), err, false)
	}
	s.seeRev(resp.Header.Revision)
	if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) > 0 && resource != "" {
		ns := decodeNS(resource, kvs[0].Value)
		s.mu.Lock()
		s.learnNS(ns, resp.Header.Revision)
		s.mu.Unlock()
		return &ns, nil, nil
	}
	waiterKVs := resp.Responses[1].GetResponseRange().Kvs
	waiters := int64(len(waiterKVs))
	s.mu.Lock()
	defer s.mu.Unlock()
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		// A free name: followed only while this store follows it anyway
		// (a create that follows reserves, and follows it then).
		if s.follows[resource] != nil {
			s.observe(resource, resp.Header.Revision, nil, waiterKVs)
		}
		return nil, nil, nil
	}
	r, err := s.decode(kvs[0], true)
	if err != nil {
		return nil, nil, nil
	}
	s.observe(resource, resp.Header.Revision, r, waiterKVs)
	if r = s.fresher(r, resp.Header.Revision); r == nil {
		return nil, nil, nil // ended after the read
	}
	if l := s.snapshot(r, waiters); l.Live() {
		return nil, &l, nil
	}
	return nil, nil, nil
}

var _ leasecore.NameReader = (*Store)(nil)

// ownHandleOf returns the live lease of resource when it is a handle lease
// this store keeps alive and its local end is ahead; nil otherwise.
func (s *Store) ownHandleOf(resource string) *leasecore.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live[resource]
	if r == nil {
		return nil
	}
	if d, ok := s.handleDeadline(r.l.ID); !ok || !time.Now().Before(d) {
		return nil
	}
	if k := s.known[r.l.ID]; k != nil && k.lost {
		return nil
	}
	l := s.snapshot(r, s.waitersOf(resource))
	if !l.Live() {
		return nil
	}
	return &l
}

// Load returns lease id in any status; see [leasecore.Store.Load]. A lease
// this store knows live, or knows ended on its own, is answered from what
// the store has learned (its own transactions, its watch, its reads: see
// docs/PROTOCOL.md §3, reads through an open descriptor), with no round
// trip; any other costs one, or two when the store has never seen it.
func (s *Store) Load(ctx context.Context, id string) (leasecore.Lease, error) {
	if err := s.begin(false); err != nil {
		return leasecore.Lease{}, err
	}
	if err := leasecore.ValidateLeaseID(id); err != nil {
		return leasecore.Lease{}, err
	}
	s.pastDeadline(id)
	if lost := s.lostLease(id); lost != nil {
		return *lost, nil
	}
	if r := s.current(id); r != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.snapshot(r, s.waitersOf(r.l.Resource)), nil
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
	resp, err := s.readTxn(cctx, ops...)
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
		if r = s.fresher(r, resp.Header.Revision); r == nil {
			continue // ended after the read
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
	s.mu.Lock()
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		path := strings.TrimPrefix(string(kv.Key), s.k.ns(""))
		if leasecore.ParentOf(path) == dir {
			ns := decodeNS(path, kv.Value)
			s.learnNS(ns, resp.Header.Revision)
			nss = append(nss, ns)
		}
	}
	s.mu.Unlock()
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
