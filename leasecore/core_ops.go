package leasecore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxAnnotationLen bounds each annotation string and takeover reason.
const maxAnnotationLen = 1024

// checkText validates a string that will be stored in a record: at most
// maxAnnotationLen bytes of valid UTF-8 without NUL, so that every record
// written can be read back by a TOML parser.
func checkText(s string) error {
	if len(s) > maxAnnotationLen || strings.ContainsRune(s, 0) || !utf8.ValidString(s) {
		return fmt.Errorf("%w: text longer than %d bytes, with NUL or not valid UTF-8", ErrInvalidArgument, maxAnnotationLen)
	}
	return nil
}

// applyAnnotations validates ann and applies it to l (docs/PROTOCOL.md
// §4.2). Errors: ErrInvalidArgument for a key that is not an annotation, a
// string that breaks [checkText], or a pid that is not a running process.
func applyAnnotations(l *Lease, ann Annotations) error {
	for key, v := range ann {
		f, ok := commandField(key)
		if !ok {
			return fmt.Errorf("%w: %q is not an annotation", ErrInvalidArgument, key)
		}
		if f.kind == kindString {
			if err := checkText(v); err != nil {
				return err
			}
			f.value(l).SetString(v)
			continue
		}
		pid, err := strconv.Atoi(v)
		switch {
		case err != nil || pid < 0 || pid > maxPID:
			return fmt.Errorf("%w: pid %.20q out of range", ErrInvalidArgument, v)
		case pid == 0:
			l.PID, l.PIDStartTicks = 0, 0
			continue
		}
		ticks, ok := ProcessStartTicks(pid)
		if !ok {
			return fmt.Errorf("%w: pid %d is not a running process", ErrInvalidArgument, pid)
		}
		l.PID, l.PIDStartTicks = pid, ticks
	}
	return nil
}

// Reserve grants a new lease on d.Resource when it has no live lease; see
// [Store.Reserve]. A dead lease on the name is ended as abandoned first
// (docs/PROTOCOL.md §5). The record is durable before Reserve returns.
func (s *store) Reserve(ctx context.Context, d Draft) (Grant, error) {
	return s.acquire(ctx, d, false)
}

// Acquire reserves a lease like Reserve, waiting first come first served
// while another holds the name; see [Store.Acquire].
func (s *store) Acquire(ctx context.Context, d Draft) (Grant, error) {
	return s.acquire(ctx, d, true)
}

// acquire is Reserve, and with wait Acquire: a caller that finds the name
// held joins its queue and tries again each time it is signalled while at
// the head.
func (s *store) acquire(ctx context.Context, d Draft, wait bool) (Grant, error) {
	d, err := checkDraft(d)
	if err != nil {
		return Grant{}, err
	}
	g, err := s.acquireCommitted(ctx, d, wait)
	if err != nil && g.Token != "" {
		// Granted in memory, but its commit failed: the caller never
		// learns the token, so nobody can use or release the lease.
		s.abandonUncommitted(g.Lease.ID)
		return Grant{}, err
	}
	return g, err
}

// abandonUncommitted ends lease id, whose reservation failed to commit, as
// abandoned (in memory at least: the end is deferrable).
func (s *store) abandonUncommitted(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.leases[id]; e != nil && e.lease.Status == StatusActive && !s.closed {
		_ = s.endLocked(e, e.lease, StatusAbandoned, ChangeExpired, "its reservation could not be committed", true)
	}
}

// acquireCommitted is acquire after the draft is checked.
func (s *store) acquireCommitted(ctx context.Context, d Draft, wait bool) (_ Grant, err error) {
	if err := s.begin(true); err != nil {
		return Grant{}, err
	}
	defer s.unlock(&err)
	if !wait {
		return s.reserveLocked(d)
	}
	var w *waiter
	defer func() {
		if w != nil && !w.done {
			// Interrupted or closed: leave the queue, and let the next
			// waiter have the name if it is free.
			s.queues.remove(d.Resource, w)
			s.persist.publishWaiters(s.queues.counts())
			s.handOff(d.Resource)
		}
	}()
	for {
		switch {
		case s.closed:
			return Grant{}, ErrClosed
		case w != nil && w.done && w.err == nil && !s.stillLive(w.grant.Lease.ID):
			// The lease handed to this waiter ended before it woke (a
			// holder of its uid removed the name): the grant is void. The
			// waiter goes back to the head of the queue and gets the name
			// as soon as it is free again.
			w.done, w.grant = false, Grant{}
			s.queues.pushFront(d.Resource, w)
			s.persist.publishWaiters(s.queues.counts())
			s.handOff(d.Resource)
			if w.done {
				continue
			}
		case w != nil && w.done:
			// Granted, even if ctx ended meanwhile: the grant came first,
			// and the caller holds the lease (see [Store.Acquire]).
			return w.grant, w.err
		case w == nil && s.queues.count(d.Resource) == 0:
			g, err := s.reserveLocked(d)
			if !errors.Is(err, ErrHeld) {
				return g, err
			}
		}
		if w == nil {
			w = s.queues.enqueue(d.Resource, d)
			s.persist.publishWaiters(s.queues.counts())
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-w.turn:
		}
		s.mu.Lock()
		if ctx.Err() != nil && !w.done {
			return Grant{}, ctx.Err()
		}
	}
}

// stillLive reports whether lease id is the live lease of its resource.
// The caller holds mu.
func (s *store) stillLive(id string) bool {
	e := s.leases[id]
	return e != nil && e.lease.Status == StatusActive && s.live[e.lease.Resource] == e
}

// checkDraft validates d and fills its default mode.
func checkDraft(d Draft) (Draft, error) {
	if err := ValidateResource(d.Resource); err != nil {
		return d, err
	}
	switch d.Mode {
	case "":
		d.Mode = ModeToken
	case ModeToken, ModeHandle:
	default:
		return d, fmt.Errorf("%w: mode %q", ErrInvalidArgument, d.Mode)
	}
	return d, nil
}

// reserveLocked is Reserve with mu held.
func (s *store) reserveLocked(d Draft) (Grant, error) {

	if parent := parentOf(d.Resource); parent != "" {
		if _, ok := s.namespaces[parent]; !ok {
			return Grant{}, fmt.Errorf("%w: %q", ErrNoNamespace, parent)
		}
	}
	if _, ok := s.namespaces[d.Resource]; ok {
		return Grant{}, fmt.Errorf("%w: %q", ErrIsNamespace, d.Resource)
	}
	if e := s.live[d.Resource]; e != nil {
		live, err := s.checkLive(e)
		if err != nil {
			return Grant{}, err
		}
		if live {
			return Grant{}, &LeaseHeldError{Holder: s.snapshot(e)}
		}
	}
	if s.perUID[d.HolderUID] >= s.opts.MaxLeasesPerUID {
		// The count includes leases that died since they were last
		// looked at: end those before refusing (docs/PROTOCOL.md §7 limits live ones).
		for _, e := range s.live {
			if e.lease.HolderUID != d.HolderUID {
				continue
			}
			if _, err := s.checkLive(e); err != nil {
				return Grant{}, err
			}
		}
		if s.perUID[d.HolderUID] >= s.opts.MaxLeasesPerUID {
			return Grant{}, fmt.Errorf("%w: uid %d holds %d live leases", ErrQuota, d.HolderUID, s.perUID[d.HolderUID])
		}
	}
	now := s.opts.Clock.Now().UTC()
	token := NewToken()
	l := Lease{
		ID:          NewLeaseID(),
		Resource:    d.Resource,
		Status:      StatusActive,
		Mode:        d.Mode,
		Generation:  s.highGeneration + 1,
		HolderUID:   d.HolderUID,
		HolderGID:   d.HolderGID,
		HolderPID:   d.HolderPID,
		Host:        s.opts.Host,
		StartedAt:   now,
		HeartbeatAt: now,
		BootID:      s.bootID,
	}
	if err := applyAnnotations(&l, d.Annotations); err != nil {
		return Grant{}, err
	}
	hash := HashToken(token)
	stamp, err := s.persist.writeRecord(&l, hash)
	if err != nil {
		return Grant{}, err
	}
	s.highGeneration = l.Generation
	e := &entry{lease: l, hash: hash, hbMono: s.opts.Clock.Mono(), stamp: stamp}
	s.leases[l.ID] = e
	s.addLive(e)
	snap := s.snapshot(e)
	s.feed.Publish(0, Event{Kind: EventReserved, Change: ChangeReserved, Lease: snap})
	return Grant{Lease: snap, Token: token}, nil
}

// lookupActive finds lease id and checks that it is live, ending it if it
// is dead. The caller holds mu.
func (s *store) lookupActive(id string) (*entry, error) {
	if err := ValidateLeaseID(id); err != nil {
		return nil, err
	}
	e := s.leases[id]
	if e == nil {
		return nil, fmt.Errorf("%w: lease %s", ErrNotFound, id)
	}
	live, err := s.checkLive(e)
	if err != nil {
		return nil, err
	}
	if !live {
		return nil, fmt.Errorf("%w: lease %s is %s", ErrInactive, id, e.lease.Status)
	}
	return e, nil
}

// mutateActive runs change on live lease id under the store's mutex, after
// checking token when one is given, and returns the resulting lease; a lease
// still live after it is published as what. change must persist before it
// alters the entry. The caller does not hold mu.
func (s *store) mutateActive(id string, token *string, what Change, change func(*entry) error) (_ Lease, err error) {
	if err := s.begin(true); err != nil {
		return Lease{}, err
	}
	defer s.unlock(&err)
	e, err := s.lookupActive(id)
	if err != nil {
		return Lease{}, err
	}
	if token != nil && !TokenMatches(*token, e.hash) {
		return Lease{}, fmt.Errorf("%w: lease %s", ErrTokenMismatch, id)
	}
	if err := change(e); err != nil {
		return Lease{}, err
	}
	snap := s.snapshot(e)
	if snap.Live() {
		s.feed.Publish(0, Event{Kind: EventChanged, Change: what, Lease: snap})
	}
	return snap, nil
}

// Renew authenticates token and moves the heartbeat of lease id to now,
// applying ann; see [Store.Renew].
func (s *store) Renew(ctx context.Context, id, token string, ann Annotations) (Lease, error) {
	return s.mutateActive(id, &token, ChangeRenewed, func(e *entry) error {
		l := e.lease
		if err := applyAnnotations(&l, ann); err != nil {
			return err
		}
		l.HeartbeatAt = s.opts.Clock.Now().UTC()
		stamp, err := s.persist.writeRecord(&l, e.hash)
		if err != nil {
			return err
		}
		e.lease, e.hbMono, e.stamp = l, s.opts.Clock.Mono(), stamp
		return nil
	})
}

func checkEndStatus(status Status) error {
	if status != StatusComplete && status != StatusAbandoned {
		return fmt.Errorf("%w: end status %q", ErrInvalidArgument, status)
	}
	return nil
}

// Release authenticates token, applies ann and ends lease id with status;
// see [Store.Release].
func (s *store) Release(ctx context.Context, id, token string, status Status, ann Annotations) (Lease, error) {
	if err := checkEndStatus(status); err != nil {
		return Lease{}, err
	}
	return s.mutateActive(id, &token, ChangeReleased, func(e *entry) error {
		annotated := e.lease
		if err := applyAnnotations(&annotated, ann); err != nil {
			return err
		}
		return s.endLocked(e, annotated, status, ChangeReleased, "released by its holder", false)
	})
}

// End ends lease id with status without a token; see [Store.End].
func (s *store) End(ctx context.Context, id string, status Status) (Lease, error) {
	if err := checkEndStatus(status); err != nil {
		return Lease{}, err
	}
	return s.mutateActive(id, nil, ChangeReleased, func(e *entry) error {
		// No token was shown: the mount ended it for a caller it authorised
		// (an unlink by the holder uid, the close of a handle lease) or on
		// the holder's behalf (a handover, a refused call's reservation),
		// and logs which.
		return s.endLocked(e, e.lease, status, ChangeReleased, "ended by the mount without a token", false)
	})
}

// Bind turns live lease id into a handle lease; see [Store.Bind].
func (s *store) Bind(ctx context.Context, id string, holderPID int) (Lease, error) {
	return s.mutateActive(id, nil, ChangeBound, func(e *entry) error {
		if e.lease.Mode == ModeHandle && (holderPID <= 0 || holderPID == e.lease.HolderPID) && e.lease.Daemon == "" {
			return nil
		}
		l := e.lease
		l.Mode = ModeHandle
		l.Daemon, l.HolderPIDs = "", "" // bound to an open file of this daemon
		if holderPID > 0 {
			l.HolderPID = holderPID
		}
		stamp, err := s.persist.writeRecord(&l, e.hash)
		if err != nil {
			return err
		}
		e.lease, e.stamp = l, stamp
		return nil
	})
}

// RequestTakeover records req on live lease id; see [Store.RequestTakeover].
func (s *store) RequestTakeover(ctx context.Context, id string, req TakeoverRequest) (Lease, error) {
	for _, text := range []string{req.By, req.Reason} {
		if err := checkText(text); err != nil {
			return Lease{}, err
		}
	}
	return s.mutateActive(id, nil, ChangeTakeoverRequested, func(e *entry) error {
		l := e.lease
		l.TakeoverRequestedBy = req.By
		l.TakeoverRequestedAt = s.opts.Clock.Now().UTC()
		l.TakeoverReason = req.Reason
		stamp, err := s.persist.writeRecord(&l, e.hash)
		if err != nil {
			return err
		}
		e.lease, e.stamp = l, stamp
		return nil
	})
}

// Live returns the live lease on resource; see [Store.Live].
func (s *store) Live(ctx context.Context, resource string) (_ Lease, err error) {
	if err := s.begin(false); err != nil {
		return Lease{}, err
	}
	defer s.unlock(&err)
	e := s.live[resource]
	if e == nil || !s.alive(e) {
		return Lease{}, fmt.Errorf("%w: no live lease on %q", ErrNotFound, resource)
	}
	return s.snapshot(e), nil
}

// Load returns lease id in any status; see [Store.Load].
func (s *store) Load(ctx context.Context, id string) (_ Lease, err error) {
	if err := ValidateLeaseID(id); err != nil {
		return Lease{}, err
	}
	if err := s.begin(false); err != nil {
		return Lease{}, err
	}
	defer s.unlock(&err)
	e := s.leases[id]
	if e == nil {
		return Lease{}, fmt.Errorf("%w: lease %s", ErrNotFound, id)
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
func (s *store) liveLocked(keep func(resource string) bool) []Lease {
	es := s.sortedLive(keep)
	if len(es) == 0 {
		return nil
	}
	out := make([]Lease, len(es))
	for i, e := range es {
		out[i] = s.snapshot(e)
	}
	return out
}

// sortedLive returns the live entries whose resource keep accepts, sorted
// by resource. The caller holds mu.
func (s *store) sortedLive(keep func(resource string) bool) []*entry {
	type keyed struct {
		resource string
		e        *entry
	}
	ks := make([]keyed, 0, len(s.live))
	for resource, e := range s.live {
		if keep(resource) && s.alive(e) {
			ks = append(ks, keyed{resource, e})
		}
	}
	sortParallel(ks, func(a, b keyed) int { return strings.Compare(a.resource, b.resource) })
	es := make([]*entry, len(ks))
	for i, k := range ks {
		es[i] = k.e
	}
	return es
}

// EachLive calls fn with every live lease, sorted by resource, as [List]
// returns them, and n, the number of them, without copying them all
// first: a listing of 100,000 leases ("leasefs ls") spares a 40 MB slice.
// The *Lease is valid only during the call; fn runs with the store's mutex
// held and must not call the store. It stops at the first error of fn and
// returns it. Errors: ErrClosed, or fn's.
func (s *store) EachLive(ctx context.Context, fn func(l *Lease, n int) error) (err error) {
	if err := s.begin(false); err != nil {
		return err
	}
	defer s.unlock(&err)
	es := s.sortedLive(func(string) bool { return true })
	// One copy reused for every call: a copy per lease would escape to the
	// heap, 40 MB of garbage for a listing of 100,000.
	var l Lease
	for _, e := range es {
		l = s.snapshot(e)
		if err := fn(&l, len(es)); err != nil {
			return err
		}
	}
	return nil
}

// List returns every live lease sorted by resource; see [Store.List].
func (s *store) List(ctx context.Context) (_ []Lease, err error) {
	if err := s.begin(false); err != nil {
		return nil, err
	}
	defer s.unlock(&err)
	return s.liveLocked(func(string) bool { return true }), nil
}

// ListDir returns the namespaces and live leases directly inside dir; see
// [Store.ListDir].
func (s *store) ListDir(ctx context.Context, dir string) (_ []Namespace, _ []Lease, err error) {
	if err := s.begin(false); err != nil {
		return nil, nil, err
	}
	defer s.unlock(&err)
	if _, ok := s.namespaces[dir]; dir != "" && !ok {
		return nil, nil, fmt.Errorf("%w: %q", ErrNoNamespace, dir)
	}
	var nss []Namespace
	for p, ns := range s.namespaces {
		if p != "" && parentOf(p) == dir {
			nss = append(nss, ns)
		}
	}
	slices.SortFunc(nss, func(a, b Namespace) int { return strings.Compare(a.Path, b.Path) })
	return nss, s.liveLocked(func(resource string) bool { return parentOf(resource) == dir }), nil
}

// History returns ended leases newest first; see [Store.History].
func (s *store) History(ctx context.Context, resource string) (_ []Lease, err error) {
	if err := s.begin(false); err != nil {
		return nil, err
	}
	defer s.unlock(&err)
	var out []Lease
	for _, e := range s.leases {
		if e.lease.Status != StatusActive && (resource == "" || e.lease.Resource == resource) {
			out = append(out, s.snapshot(e))
		}
	}
	slices.SortFunc(out, func(a, b Lease) int {
		return cmp.Or(b.CompletedAt.Compare(a.CompletedAt), cmp.Compare(b.Generation, a.Generation))
	})
	return out, nil
}

// Watch returns the change feed: every event of kinds (every event when
// none is given) from now on, in order, until ctx is done or the store is
// closed; see [Store.Watch].
func (s *store) Watch(ctx context.Context, kinds ...EventKind) <-chan Event {
	return s.feed.Subscribe(ctx, 0, kinds...)
}
