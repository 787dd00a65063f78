package engine

import (
	"github.com/leasefs/leasefs/leasecore"

	"cmp"
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/leasefs/leasefs/internal/retrylog"
)

// startReaper runs the reaper until Close: every ReapInterval, and at once
// when a read found a dead lease, it ends dead leases and prunes history.
func (s *Engine) startReaper() {
	ctx, cancel := context.WithCancel(context.Background())
	s.stopReaper, s.reaped = cancel, make(chan struct{})
	go func() {
		defer close(s.reaped)
		var tries retrylog.Tries
		tick := time.NewTicker(s.opts.ReapInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			case <-s.kick:
			}
			switch _, err := s.Reap(ctx); {
			case err == nil:
				tries.Succeeded(s.opts.Logger, "reaped after failed tries")
			case ctx.Err() == nil:
				tries.Failed(s.opts.Logger, slog.LevelError, "reap failed; retrying", err)
			}
		}
	}()
}

// wakeReaper asks the reaper to run soon; it never blocks.
func (s *Engine) wakeReaper() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Reap ends every dead lease as abandoned, publishing each end, and prunes
// history beyond Options.HistoryKeep, a chunk per hold of the mutex (it
// stops between chunks once ctx is done); it returns the leases it ended.
// The store's reaper calls it; tests call it to reap at once. Errors: ErrClosed,
// ErrReadOnly, *PersistError from pruning.
func (s *Engine) Reap(ctx context.Context) ([]leasecore.Lease, error) {
	ended, prune, err := s.reapLive()
	if err != nil {
		return ended, err
	}
	return ended, s.prune(ctx, prune)
}

// reapLive is the first step of Reap, under one hold of mu: it ends the
// dead leases and returns them, with the ids of the ended records that
// pruning removes (the oldest beyond HistoryKeep, oldest first).
func (s *Engine) reapLive() (_ []leasecore.Lease, prune []string, err error) {
	if err := s.begin(true); err != nil {
		return nil, nil, err
	}
	defer s.unlock(&err)
	if err := s.syncLocked(); err != nil {
		s.syncTries.Failed(s.opts.Logger, slog.LevelWarn, "records of ended leases still cannot be written; retrying", err, "count", len(s.unsynced))
	} else {
		s.syncTries.Succeeded(s.opts.Logger, "records of ended leases written after failed tries")
	}
	var ended []leasecore.Lease
	for _, e := range s.live {
		live, err := s.checkLive(e)
		if err != nil {
			return ended, nil, err
		}
		if !live {
			ended = append(ended, s.snapshot(e))
		}
	}
	return ended, s.pruneCandidates(), nil
}

// PruneChunk is how many records one hold of mu prunes: 32 (each record
// file is renamed into the spare pool), so that a call waiting for mu
// meanwhile waits no longer than about one change takes, however many
// records a prune removes.
const PruneChunk = 32

// pruneCandidates returns the ids of the oldest ended records beyond
// HistoryKeep, oldest first (by completion time, then generation). The
// caller holds mu.
func (s *Engine) pruneCandidates() []string {
	var ended []*Record
	for _, e := range s.leases {
		if e.Lease.Status != leasecore.StatusActive {
			ended = append(ended, e)
		}
	}
	excess := len(ended) - s.opts.HistoryKeep
	if excess <= 0 {
		return nil
	}
	slices.SortFunc(ended, func(a, b *Record) int {
		return cmp.Or(a.Lease.CompletedAt.Compare(b.Lease.CompletedAt), cmp.Compare(a.Lease.Generation, b.Lease.Generation))
	})
	ids := make([]string, excess)
	for i, e := range ended[:excess] {
		ids[i] = e.Lease.ID
	}
	return ids
}

// prune removes the ended records ids, PruneChunk of them per hold of mu,
// after persisting the generation high-water mark so that no generation is
// ever granted twice (docs/PROTOCOL.md §1). An id no longer held by then
// is skipped. It stops between chunks once ctx is done (the store is
// closing). Errors: ErrClosed, *PersistError; the records not yet removed
// stay, and the next prune retries them.
func (s *Engine) prune(ctx context.Context, ids []string) error {
	for len(ids) > 0 && ctx.Err() == nil {
		n := min(len(ids), PruneChunk)
		if err := s.pruneSome(ids[:n]); err != nil {
			return err
		}
		ids = ids[n:]
	}
	return nil
}

// pruneSome is one chunk of prune, under one hold of mu.
func (s *Engine) pruneSome(ids []string) (err error) {
	if err := s.begin(true); err != nil {
		return err
	}
	defer s.unlock(&err)
	ids = slices.DeleteFunc(slices.Clone(ids), func(id string) bool {
		e := s.leases[id]
		return e == nil || e.Lease.Status == leasecore.StatusActive
	})
	if len(ids) == 0 {
		return nil
	}
	if err := s.persist.SaveGeneration(s.highGeneration); err != nil {
		return err
	}
	if err := s.persist.RemoveRecords(ids); err != nil {
		return err
	}
	for _, id := range ids {
		delete(s.leases, id)
		delete(s.unsynced, id)
	}
	return nil
}
