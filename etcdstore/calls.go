package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/leasecore"
)

// call bounds one cluster call by the call timeout.
func (s *Store) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.callTimeout())
}

// downCallTimeout bounds each cluster call while the store knows the
// cluster is unreachable (a call failed and none succeeded since): one
// syscall may need several calls, and each waiting the full CallTimeout
// would make it fail only after several of them.
const downCallTimeout = time.Second

// callTimeout returns how long the next cluster call may take:
// Options.CallTimeout, or at most downCallTimeout while the cluster is
// known to be unreachable.
func (s *Store) callTimeout() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.health.Reachable {
		return min(s.opts.CallTimeout, downCallTimeout)
	}
	return s.opts.CallTimeout
}

// errRaced: a transaction's comparison failed because another change came
// first; the caller reads again.
var errRaced = errors.New("etcdstore: raced with another change")

// unreachable wraps a failed cluster call. A change that may have been
// applied (applied) matches [leasecore.ErrOutcomeUnknown]; every failure is
// a *[leasecore.PersistError], which fusefs answers with EIO. A call ended
// by the caller's own ctx returns ctx's error.
func (s *Store) unreachable(ctx context.Context, op, key string, err error, applied bool) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return leasecore.ErrClosed
	}
	s.cutOff(op, key, err)
	if applied {
		err = fmt.Errorf("%w: %w", leasecore.ErrOutcomeUnknown, err)
	}
	return &leasecore.PersistError{Op: "etcd " + op, Path: key, Err: err}
}

// readTxn commits a read-only transaction of ops within cctx, a context
// bounded by [Store.call] or [Store.callFor]. A read changes nothing, so a
// read the cluster refuses because it is electing a leader (see
// [electing]) is asked again, every electionRetry, until it is answered or
// cctx ends: an election is not an outage (docs/PROTOCOL.md §8a). The
// client library retries only a Range on such an answer, not a Txn.
func (s *Store) readTxn(cctx context.Context, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	for {
		resp, err := s.cli.Txn(cctx).Then(ops...).Commit()
		if err == nil || !electing(err) {
			return resp, err
		}
		select {
		case <-cctx.Done():
			return nil, err
		case <-time.After(electionRetry):
		}
	}
}

// electionRetry is how long a read refused during an election waits before
// it asks again.
const electionRetry = 50 * time.Millisecond

// electing reports whether err is etcd's answer while its members elect a
// leader: "leader changed", "no leader", or a proposal timed out because
// the leader failed. The cluster is there; it answers again within an
// election timeout.
func electing(err error) bool {
	for _, e := range []error{rpctypes.ErrLeaderChanged, rpctypes.ErrNoLeader, rpctypes.ErrTimeoutDueToLeaderFail} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// cutOff counts a call that the cluster did not answer and, when the store
// had the cluster until then, logs the one line that says it is gone. A
// call refused by an election ([electing]) is counted, and logged as a
// warning at most once a second, but does not mark the cluster
// unreachable: no "unreachable" and "reachable again" pair per election.
func (s *Store) cutOff(op, key string, err error) {
	if electing(err) {
		s.mu.Lock()
		s.health.Failures++
		warn := time.Since(s.electionWarned) >= time.Second
		if warn {
			s.electionWarned = time.Now()
		}
		s.mu.Unlock()
		if warn {
			s.opts.Logger.Warn("etcd cluster is electing a leader: a call it refused meanwhile fails with EIO",
				"endpoints", strings.Join(s.cli.Endpoints(), ","), "op", op, "key", key, "err", err)
		}
		return
	}
	s.mu.Lock()
	s.health.Failures++
	first := s.health.Reachable
	if first {
		s.health.Reachable, s.health.Since = false, time.Now()
	}
	s.mu.Unlock()
	if first {
		s.opts.Logger.Error("etcd cluster unreachable: calls that need it fail with EIO until it answers",
			"endpoints", strings.Join(s.cli.Endpoints(), ","), "op", op, "key", key, "err", err)
	}
}

// Health reports whether the cluster answered the store's last call, since
// when, and how many calls it failed (see [leasecore.HealthReporter]).
func (s *Store) Health() leasecore.Health {
	now := time.Now()
	s.mu.Lock()
	n, entered := s.jeopardyLocked(now)
	end := s.hs.deadline
	h := s.health
	h.InJeopardy = s.jeopardyCountLocked()
	s.mu.Unlock()
	if entered {
		s.warnJeopardy(n, end)
	}
	return h
}

// seeRev records that the store has seen the cluster at revision rev.
func (s *Store) seeRev(rev int64) {
	s.mu.Lock()
	s.rev = max(s.rev, rev)
	back := !s.health.Reachable
	var down time.Duration
	if back {
		down = time.Since(s.health.Since)
		s.health.Reachable, s.health.Since = true, time.Now()
	}
	s.mu.Unlock()
	if back {
		s.opts.Logger.Info("etcd cluster reachable again", "endpoints", strings.Join(s.cli.Endpoints(), ","),
			"after", down.Round(time.Millisecond))
	}
}
