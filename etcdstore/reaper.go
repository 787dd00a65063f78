package etcdstore

import (
	"context"
	"errors"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/internal/retrylog"
	"github.com/leasefs/leasefs/leasecore"
)

// reaper ends leases that the liveness rules killed, from the live leases
// the watch shows (no round trip unless one looks dead), and prunes
// history beyond HistoryKeep at most once a second.
func (s *Store) reaper() {
	tick := time.NewTicker(s.opts.ReapInterval)
	defer tick.Stop()
	lastPrune := time.Now()
	var reaps, prunes retrylog.Tries
	for {
		select {
		case <-s.bg.Done():
			return
		case <-tick.C:
		case <-s.kick:
		}
		s.mu.Lock()
		var dead []*rec
		for _, r := range s.live {
			if s.known[r.l.ID] != nil && s.known[r.l.ID].lost {
				continue // being removed by lost
			}
			if d, ok := s.handleDeadline(r.l.ID); ok && !time.Now().Before(d) {
				continue // its keep-alive loop ends it now (lost)
			}
			if s.deadReason(r) != "" {
				dead = append(dead, r)
			}
		}
		prune := s.ended > 0 && time.Since(lastPrune) >= time.Second
		s.mu.Unlock()
		failed := false
		for _, r := range dead {
			cur, err := s.getLive(background(s.bg), r.l.Resource)
			if err != nil || cur == nil || cur.l.ID != r.l.ID {
				continue
			}
			s.mu.Lock()
			reason := s.deadReason(cur)
			s.mu.Unlock()
			if reason == "" {
				continue
			}
			if _, err := s.end(background(s.bg), cur, cur.l, leasecore.StatusAbandoned, chExpired); err == nil {
				s.logEnd(cur.l, reason)
			} else if !errors.Is(err, errRaced) && s.bg.Err() == nil {
				failed = true
				reaps.Failed(s.opts.Logger, slog.LevelError, "reap failed; retrying", err, "lease", cur.l.ID)
			}
		}
		if !failed && len(dead) > 0 {
			reaps.Succeeded(s.opts.Logger, "reaped after failed tries")
		}
		if prune {
			lastPrune = time.Now()
			s.mu.Lock()
			s.ended = 0
			s.mu.Unlock()
			if err := s.prune(background(s.bg)); err != nil && s.bg.Err() == nil {
				prunes.Failed(s.opts.Logger, slog.LevelWarn, "pruning history failed; retrying", err)
			} else if err == nil {
				prunes.Succeeded(s.opts.Logger, "history pruned after failed tries")
			}
		}
	}
}

// prune deletes the oldest history records beyond HistoryKeep (oldest by
// the revision that wrote them). Generations are etcd revisions, so
// pruning never lowers them.
func (s *Store) prune(ctx context.Context) error {
	cctx, done := s.call(ctx)
	resp, err := s.cli.Get(cctx, s.k.historyPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	done()
	if err != nil {
		return err
	}
	excess := resp.Count - int64(s.opts.HistoryKeep)
	for excess > 0 {
		batch := min(excess, 100) // etcd's default limit is 128 operations a transaction
		cctx, done := s.call(ctx)
		old, err := s.cli.Get(cctx, s.k.historyPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend), clientv3.WithLimit(batch))
		done()
		if err != nil {
			return err
		}
		if len(old.Kvs) == 0 {
			return nil
		}
		ops := make([]clientv3.Op, len(old.Kvs))
		for i, kv := range old.Kvs {
			ops[i] = clientv3.OpDelete(string(kv.Key))
		}
		cctx, done = s.call(ctx)
		_, err = s.cli.Txn(cctx).Then(ops...).Commit()
		done()
		if err != nil {
			return err
		}
		excess -= int64(len(old.Kvs))
	}
	return nil
}
