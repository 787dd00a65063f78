package engine

import (
	"github.com/leasefs/leasefs/leasecore"

	"context"
	"fmt"
)

// lookupActive finds lease id and checks that it is live, ending it if it
// is dead. The caller holds mu.
func (s *Engine) lookupActive(id string) (*Record, error) {
	if err := leasecore.ValidateLeaseID(id); err != nil {
		return nil, err
	}
	e := s.leases[id]
	if e == nil {
		return nil, fmt.Errorf("%w: lease %s", leasecore.ErrNotFound, id)
	}
	live, err := s.checkLive(e)
	if err != nil {
		return nil, err
	}
	if !live {
		return nil, fmt.Errorf("%w: lease %s is %s", leasecore.ErrInactive, id, e.Lease.Status)
	}
	return e, nil
}

// mutateActive runs change on live lease id under the store's mutex, after
// checking token when one is given, and returns the resulting lease; a lease
// still live after it is published as what. change must persist before it
// alters the entry. The caller does not hold mu.
func (s *Engine) mutateActive(id string, token *string, what leasecore.Change, change func(*Record) error) (_ leasecore.Lease, err error) {
	if err := s.begin(true); err != nil {
		return leasecore.Lease{}, err
	}
	defer s.unlock(&err)
	e, err := s.lookupActive(id)
	if err != nil {
		return leasecore.Lease{}, err
	}
	if token != nil && !leasecore.TokenMatches(*token, e.Hash) {
		return leasecore.Lease{}, fmt.Errorf("%w: lease %s", leasecore.ErrTokenMismatch, id)
	}
	if err := change(e); err != nil {
		return leasecore.Lease{}, err
	}
	snap := s.snapshot(e)
	if snap.Live() {
		s.feed.Publish(0, leasecore.Event{Kind: leasecore.EventChanged, Change: what, Lease: snap})
	}
	return snap, nil
}

// Renew authenticates token and moves the heartbeat of lease id to now,
// applying ann; see [leasecore.Store.Renew].
func (s *Engine) Renew(ctx context.Context, id, token string, ann leasecore.Annotations) (leasecore.Lease, error) {
	return s.mutateActive(id, &token, leasecore.ChangeRenewed, func(e *Record) error {
		l := e.Lease
		if err := leasecore.ApplyAnnotations(&l, ann); err != nil {
			return err
		}
		l.HeartbeatAt = s.opts.Clock.Now().UTC()
		err := s.persist.WriteRecord(&l, e.Hash)
		if err != nil {
			return err
		}
		e.Lease, e.hbMono = l, s.opts.Clock.Mono()
		return nil
	})
}

// Release authenticates token, applies ann and ends lease id with status;
// see [leasecore.Store.Release].
func (s *Engine) Release(ctx context.Context, id, token string, status leasecore.Status, ann leasecore.Annotations) (leasecore.Lease, error) {
	if err := leasecore.CheckEndStatus(status); err != nil {
		return leasecore.Lease{}, err
	}
	return s.mutateActive(id, &token, leasecore.ChangeReleased, func(e *Record) error {
		annotated := e.Lease
		if err := leasecore.ApplyAnnotations(&annotated, ann); err != nil {
			return err
		}
		return s.endLocked(e, annotated, status, leasecore.ChangeReleased, "released by its holder", false)
	})
}

// End ends lease id with status without a token; see [leasecore.Store.End].
func (s *Engine) End(ctx context.Context, id string, status leasecore.Status) (leasecore.Lease, error) {
	if err := leasecore.CheckEndStatus(status); err != nil {
		return leasecore.Lease{}, err
	}
	return s.mutateActive(id, nil, leasecore.ChangeReleased, func(e *Record) error {
		// No token was shown: the mount ended it for a caller it authorised
		// (an unlink by the holder uid, the close of a handle lease) or on
		// the holder's behalf (a handover, a refused call's reservation),
		// and logs which.
		return s.endLocked(e, e.Lease, status, leasecore.ChangeReleased, "ended by the mount without a token", false)
	})
}

// Bind turns live lease id into a handle lease; see [leasecore.Store.Bind].
func (s *Engine) Bind(ctx context.Context, id string, holderPID int) (leasecore.Lease, error) {
	return s.mutateActive(id, nil, leasecore.ChangeBound, func(e *Record) error {
		if e.Lease.Mode == leasecore.ModeHandle && (holderPID <= 0 || holderPID == e.Lease.HolderPID) && e.Lease.Daemon == "" {
			return nil
		}
		l := e.Lease
		l.Mode = leasecore.ModeHandle
		l.Daemon, l.HolderPIDs = "", "" // bound to an open file of this daemon
		if holderPID > 0 {
			l.HolderPID = holderPID
		}
		err := s.persist.WriteRecord(&l, e.Hash)
		if err != nil {
			return err
		}
		e.Lease = l
		return nil
	})
}

// Note records the holder's note on live lease id; see [leasecore.Store.Note].
func (s *Engine) Note(ctx context.Context, id, note string) (leasecore.Lease, error) {
	if err := leasecore.CheckNote(note); err != nil {
		return leasecore.Lease{}, err
	}
	return s.mutateActive(id, nil, leasecore.ChangeNoted, func(e *Record) error {
		if e.Lease.Note == note {
			return nil
		}
		l := e.Lease
		l.Note = note
		err := s.persist.WriteRecord(&l, e.Hash)
		if err != nil {
			return err
		}
		e.Lease = l
		return nil
	})
}

// RequestTakeover records req on live lease id; see [leasecore.Store.RequestTakeover].
func (s *Engine) RequestTakeover(ctx context.Context, id string, req leasecore.TakeoverRequest) (leasecore.Lease, error) {
	for _, text := range []string{req.By, req.Reason} {
		if err := leasecore.CheckText(text); err != nil {
			return leasecore.Lease{}, err
		}
	}
	return s.mutateActive(id, nil, leasecore.ChangeTakeoverRequested, func(e *Record) error {
		l := e.Lease
		l.TakeoverRequestedBy = req.By
		l.TakeoverRequestedAt = s.opts.Clock.Now().UTC()
		l.TakeoverReason = req.Reason
		err := s.persist.WriteRecord(&l, e.Hash)
		if err != nil {
			return err
		}
		e.Lease = l
		return nil
	})
}
