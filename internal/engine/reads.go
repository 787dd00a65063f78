package engine

import (
	"github.com/leasefs/leasefs/internal/sortpar"
	"github.com/leasefs/leasefs/leasecore"

	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
)

// Live returns the live lease on resource; see [leasecore.Store.Live].
func (s *Engine) Live(ctx context.Context, resource string) (_ leasecore.Lease, err error) {
	if err := s.begin(false); err != nil {
		return leasecore.Lease{}, err
	}
	defer s.unlock(&err)
	e := s.live[resource]
	if e == nil || !s.alive(e) {
		return leasecore.Lease{}, fmt.Errorf("%w: no live lease on %q", leasecore.ErrNotFound, resource)
	}
	return s.snapshot(e), nil
}

// Load returns lease id in any status; see [leasecore.Store.Load].
func (s *Engine) Load(ctx context.Context, id string) (_ leasecore.Lease, err error) {
	if err := leasecore.ValidateLeaseID(id); err != nil {
		return leasecore.Lease{}, err
	}
	if err := s.begin(false); err != nil {
		return leasecore.Lease{}, err
	}
	defer s.unlock(&err)
	e := s.leases[id]
	if e == nil {
		return leasecore.Lease{}, fmt.Errorf("%w: lease %s", leasecore.ErrNotFound, id)
	}
	return s.view(e), nil
}

// liveLocked returns the live leases whose resource keep accepts, sorted by resource;
// dead ones are left to the reaper. The caller holds mu.
//
// The entries are sorted by (resource, entry) pairs before they are
// copied: a swap moves 24 bytes where sorting leases would move a whole
// Lease, and a comparison reads the resource strings, small and packed,
// without touching the entries. For 100,000 leases this is most of the
// cost of a listing.
func (s *Engine) liveLocked(keep func(resource string) bool) []leasecore.Lease {
	es := s.sortedLive(keep)
	if len(es) == 0 {
		return nil
	}
	out := make([]leasecore.Lease, len(es))
	for i, e := range es {
		out[i] = s.snapshot(e)
	}
	return out
}

// sortedLive returns the live entries whose resource keep accepts, sorted
// by resource. The caller holds mu.
func (s *Engine) sortedLive(keep func(resource string) bool) []*Record {
	type keyed struct {
		resource string
		e        *Record
	}
	ks := make([]keyed, 0, len(s.live))
	for resource, e := range s.live {
		if keep(resource) && s.alive(e) {
			ks = append(ks, keyed{resource, e})
		}
	}
	sortpar.Sort(ks, func(a, b keyed) int { return strings.Compare(a.resource, b.resource) })
	es := make([]*Record, len(ks))
	for i, k := range ks {
		es[i] = k.e
	}
	return es
}

// EachLive ([leasecore.LiveLister]) calls fn with every live lease,
// sorted by resource, as [List] returns them, and n, the number of them, without copying them all
// first: a listing of 100,000 leases ("leasefs ls") spares a 40 MB slice.
// The *Lease is valid only during the call; fn runs with the store's mutex
// held and must not call the store. It stops at the first error of fn and
// returns it. Errors: ErrClosed, or fn's.
func (s *Engine) EachLive(ctx context.Context, fn func(l *leasecore.Lease, n int) error) (err error) {
	if err := s.begin(false); err != nil {
		return err
	}
	defer s.unlock(&err)
	es := s.sortedLive(func(string) bool { return true })
	// One copy reused for every call: a copy per lease would escape to the
	// heap, 40 MB of garbage for a listing of 100,000.
	var l leasecore.Lease
	for _, e := range es {
		l = s.snapshot(e)
		if err := fn(&l, len(es)); err != nil {
			return err
		}
	}
	return nil
}

// List returns every live lease sorted by resource; see [leasecore.Store.List].
func (s *Engine) List(ctx context.Context) (_ []leasecore.Lease, err error) {
	if err := s.begin(false); err != nil {
		return nil, err
	}
	defer s.unlock(&err)
	return s.liveLocked(func(string) bool { return true }), nil
}

// ListDir returns the namespaces and live leases directly inside dir; see
// [leasecore.Store.ListDir].
func (s *Engine) ListDir(ctx context.Context, dir string) (_ []leasecore.Namespace, _ []leasecore.Lease, err error) {
	if err := s.begin(false); err != nil {
		return nil, nil, err
	}
	defer s.unlock(&err)
	if _, ok := s.namespaces[dir]; dir != "" && !ok {
		return nil, nil, fmt.Errorf("%w: %q", leasecore.ErrNoNamespace, dir)
	}
	var nss []leasecore.Namespace
	for p, ns := range s.namespaces {
		if p != "" && leasecore.ParentOf(p) == dir {
			nss = append(nss, ns)
		}
	}
	slices.SortFunc(nss, func(a, b leasecore.Namespace) int { return strings.Compare(a.Path, b.Path) })
	return nss, s.liveLocked(func(resource string) bool { return leasecore.ParentOf(resource) == dir }), nil
}

// History returns ended leases newest first; see [leasecore.Store.History].
func (s *Engine) History(ctx context.Context, resource string) (_ []leasecore.Lease, err error) {
	if err := s.begin(false); err != nil {
		return nil, err
	}
	defer s.unlock(&err)
	var out []leasecore.Lease
	for _, e := range s.leases {
		if e.Lease.Status != leasecore.StatusActive && (resource == "" || e.Lease.Resource == resource) {
			out = append(out, s.snapshot(e))
		}
	}
	slices.SortFunc(out, func(a, b leasecore.Lease) int {
		return cmp.Or(b.CompletedAt.Compare(a.CompletedAt), cmp.Compare(b.Generation, a.Generation))
	})
	return out, nil
}

// Watch returns the change feed: every event of kinds (every event when
// none is given) from now on, in order, until ctx is done or the store is
// closed; see [leasecore.Store.Watch].
func (s *Engine) Watch(ctx context.Context, kinds ...leasecore.EventKind) <-chan leasecore.Event {
	return s.feed.Subscribe(ctx, 0, kinds...)
}
