package leasecore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/leasefs/leasefs/internal/procfs"
)

// maxAnnotationLen bounds each annotation string and takeover reason.
const maxAnnotationLen = 1024

// checkText validates a string that will be stored in a record: at most
// maxAnnotationLen bytes of valid UTF-8 without NUL, so that every record
// written can be read back by a TOML parser.
func checkText(s string) error { return checkTextUpTo(s, maxAnnotationLen) }

// checkTextUpTo refuses text longer than max bytes, with NUL or not valid
// UTF-8. Errors: ErrInvalidArgument.
func checkTextUpTo(s string, max int) error {
	if len(s) > max || strings.ContainsRune(s, 0) || !utf8.ValidString(s) {
		return fmt.Errorf("%w: text longer than %d bytes, with NUL or not valid UTF-8", ErrInvalidArgument, max)
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
		ticks, ok := procfs.StartTicks(pid)
		if !ok {
			return fmt.Errorf("%w: pid %d is not a running process", ErrInvalidArgument, pid)
		}
		l.PID, l.PIDStartTicks = pid, ticks
	}
	return nil
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

// MaxNote is the longest holder's note in bytes (docs/PROTOCOL.md §4.2,
// "Notes").
const MaxNote = 256

// CheckNote validates a holder's note: at most [MaxNote] bytes of UTF-8
// without NUL. Errors: ErrInvalidArgument.
func CheckNote(note string) error { return checkTextUpTo(note, MaxNote) }

// Note records the holder's note on live lease id; see [Store.Note].
func (s *store) Note(ctx context.Context, id, note string) (Lease, error) {
	if err := CheckNote(note); err != nil {
		return Lease{}, err
	}
	return s.mutateActive(id, nil, ChangeNoted, func(e *entry) error {
		if e.lease.Note == note {
			return nil
		}
		l := e.lease
		l.Note = note
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
