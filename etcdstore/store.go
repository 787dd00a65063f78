// Package etcdstore is the etcd store of docs/PROTOCOL.md §8a: a
// [leasecore.Store] whose leases live in an etcd v3 cluster, so that
// leasefs mounts on many machines share one lease namespace and serve it
// with the same file protocol.
//
// A lease is the key PREFIX/live/<resource>, holding its record (the TOML
// of docs/PROTOCOL.md §4.3) and bound to an etcd lease whose TTL is the
// lease duration. Reserve is a transaction that succeeds only if the key
// does not exist; its revision is the lease's generation (etcd revisions
// are cluster-wide and strictly increasing, so generations are too).
// Renew compares the key's mod revision, writes the new heartbeat and
// keeps the etcd lease alive; release deletes the key, writes the ended
// record under PREFIX/history/ in the same transaction, then revokes. The
// key layout is documented on [keys] and in docs/PROTOCOL.md §8a.
//
// A handle lease is kept alive by the store that holds it, and ends for
// that store at a local deadline that comes before etcd can expire it:
// the send time of its last confirmed keep-alive plus the TTL minus a
// margin (see [Store.keepAlive], docs/PROTOCOL.md §8a).
//
// Reads (Live, Load, List, ListDir, History) are linearizable etcd reads:
// a change made through any mount is seen by the next read through every
// other. The change feed ([Store.Watch]) follows an etcd watch of PREFIX.
package etcdstore

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/BurntSushi/toml"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasefs/leasefs/leasecore"
)

// DefaultCallTimeout bounds every call to the cluster.
const DefaultCallTimeout = 5 * time.Second

// DefaultSessionTTL is the TTL of a store's session lease, which holds its
// waiter keys: the waiters of a daemon that died leave the queue after it.
const DefaultSessionTTL = 10 * time.Second

// Options configure [Open]. The zero value works: every zero field takes
// its documented default.
type Options struct {
	// Options are the store options shared with the file store:
	// LeaseDuration (also the TTL of the etcd lease of every lease,
	// rounded up to whole seconds), HistoryKeep, MaxLeasesPerUID,
	// ReapInterval, Clock, Host, ReadOnly, Logger and OnCommit (called
	// once for every call whose transaction changed the cluster, with
	// that transaction's round trip). NoDaemon is ignored.
	leasecore.Options
	// DaemonID names this daemon among the daemons of its host (default
	// the host): a store that opens settles the handle leases left by a
	// previous daemon of the same Host and DaemonID, and no others
	// (docs/PROTOCOL.md §8a): those that Options.HandleHolders keeps have
	// their etcd leases kept alive again, if the cluster still has them;
	// the others are ended. The mount passes its state directory.
	DaemonID string
	// CallTimeout bounds each call to the cluster; default
	// [DefaultCallTimeout]. A call that times out fails with an error
	// matching [leasecore.ErrOutcomeUnknown] when it may have changed the
	// store.
	CallTimeout time.Duration
	// SessionTTL is the TTL of the session lease of this store's waiter
	// keys; default [DefaultSessionTTL].
	SessionTTL time.Duration
	// TLS, when set, is used to reach the cluster.
	TLS *tls.Config
	// Username and Password authenticate to the cluster when Username is
	// set.
	Username, Password string
	// DialOptions are added to the gRPC options of the store's cluster
	// client: for example interceptors that count the calls each system
	// call costs (docs/ARCHITECTURE.md, "What a system call costs").
	DialOptions []grpc.DialOption
}

// Store is a [leasecore.Store] kept in etcd. Safe for concurrent use.
type Store struct {
	cli    *clientv3.Client
	opts   Options
	k      keys
	bootID string
	ttl    int64 // seconds

	bg     context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	feed   leasecore.Feed
	kick   chan struct{}
	// bucketKick wakes keepBuckets when a bucket is used.
	bucketKick chan struct{}

	session clientv3.LeaseID // of waiter keys; 0 for a read-only store

	// mu guards the fields below. It is never held across a cluster call
	// or a log write; the feed's locks are taken after it, never before.
	mu      sync.Mutex
	closed  bool
	closing bool               // Close has begun: the session is not granted again
	rev     int64              // highest revision seen
	known   map[string]*known  // lease id → what this store knows of it
	live    map[string]*rec    // resource → live lease, as the watch last showed it
	handles map[string]*handle // lease id → a handle lease this store keeps alive on hs
	hs      hsession           // the etcd lease of this store's handle leases
	bucket  bucket             // the etcd lease of the token leases reserved or renewed now
	waiting map[string]int     // resource → waiter keys, as the watch or a read last counted them
	// queue: resource → waiter key → its create revision, as the watch
	// showed them up to revision watched (and the store's own Puts and
	// reads added); a waiter's daemon decides from it alone whether its
	// waiter is at the head (see [Store.acquireOnce]).
	queue   map[string]map[string]int64
	watched int64          // the watch (or start's read) has shown every change up to this revision
	perUID  map[uint32]int // uid → leases in live, for the quota of docs/PROTOCOL.md §7
	// previous, of a read-only store: lease id → holder pids of the
	// handle leases of this store's daemon identity that a process holds
	// through a previous daemon's mount, found at open (docs/PROTOCOL.md
	// §2, "Handle leases across restarts"); shown as
	// [leasecore.Lease.Daemon] "previous" while the lease lives.
	previous map[string]string
	changed  map[string]chan struct{} // resource → closed at its next change
	ended    int                      // leases ended since the last prune
	health   leasecore.Health         // see [Store.Health]
}

// known is what a store knows of a lease it has seen: enough to answer for
// it by id when its live key is gone and its history is not yet written.
type known struct {
	resource string
	last     leasecore.Lease
	// hb and hbMono are the heartbeat last seen and when, on the store's
	// monotonic clock (docs/PROTOCOL.md §5 rule 1).
	hb     time.Time
	hbMono time.Duration
	// lost: no keep-alive of this handle lease was confirmed before its
	// local deadline (see [Store.keepAlive]); the lease ended for this
	// store (published), even if the cluster cannot yet be told.
	lost bool
}

// handle is one handle lease that this store keeps alive on its handle
// session ([hsession]), whose deadline is the lease's local end.
type handle struct {
	// previous, for a lease bound through a previous daemon's mount that
	// this store kept at its start, is [leasecore.Lease.HolderPIDs]; ""
	// once the lease binds to an open file of this daemon. Guarded by
	// Store.mu.
	previous string
}

// localMargin is how long before the cluster could expire an etcd lease of
// TTL ttl this store considers it ended: max(ttl/3, 500 ms), and at most
// ttl/2. It covers the difference in clock rates between this host and the
// etcd leader and the time to publish the end (docs/PROTOCOL.md §8a).
func localMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/3, 500*time.Millisecond), ttl/2)
}

// keepAliveEvery is the cadence of a handle lease's keep-alives for an etcd
// lease of TTL ttl: ttl/6, so that a healthy connection renews the local
// deadline (ttl - localMargin after a send) several times over before it
// is reached.
func keepAliveEvery(ttl time.Duration) time.Duration { return ttl / 6 }

// rec is a decoded lease key.
type rec struct {
	l      leasecore.Lease
	hash   string
	change string // the change that wrote it, see changeName
	daemon string
	// duration is the lease duration of the daemon that reserved the
	// lease, the TTL of its etcd lease (0: not recorded, an older record).
	duration time.Duration
	kv       *mvccpb.KeyValue
}

// extra holds this store's keys in a record beside the fields of §4.3; the
// record decoder of leasecore ignores them.
type extra struct {
	Change   string `toml:"leasefs_change"`
	Daemon   string `toml:"leasefs_daemon"`
	Duration string `toml:"leasefs_lease_duration"`
}

// Names of changes recorded in records (leasefs_change).
const (
	chReserved = "reserved"
	chRenewed  = "renewed"
	chBound    = "bound"
	chTakeover = "takeover"
	chReleased = "released"
	chExpired  = "expired"
	chAnnotate = "annotated"
)

var changeOf = map[string]leasecore.Change{
	chReserved: leasecore.ChangeReserved, chRenewed: leasecore.ChangeRenewed,
	chBound: leasecore.ChangeBound, chTakeover: leasecore.ChangeTakeoverRequested,
	chReleased: leasecore.ChangeReleased, chExpired: leasecore.ChangeExpired,
}

var _ leasecore.Store = (*Store)(nil)

// Open connects to the cluster at endpoints ("HOST:PORT") and serves the
// leases under prefix (a "/" is appended when missing; "" is refused). It
// reads the live leases, ends the handle leases this daemon (Host and
// DaemonID) left when it last stopped, and starts the watch and the
// reaper. Errors: the cluster cannot be reached within opts.CallTimeout;
// an invalid prefix.
func Open(ctx context.Context, endpoints []string, prefix string, opts Options) (*Store, error) {
	if prefix == "" || len(endpoints) == 0 {
		return nil, errors.New("etcdstore: endpoints and a key prefix are required")
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = leasecore.DefaultLeaseDuration
	}
	if opts.HistoryKeep <= 0 {
		opts.HistoryKeep = leasecore.DefaultHistoryKeep
	}
	if opts.MaxLeasesPerUID <= 0 {
		opts.MaxLeasesPerUID = leasecore.DefaultMaxLeasesPerUID
	}
	if opts.ReapInterval <= 0 {
		opts.ReapInterval = min(max(opts.LeaseDuration/10, 50*time.Millisecond), time.Second)
	}
	if opts.Clock == nil {
		opts.Clock = leasecore.NewSystemClock()
	}
	if opts.Host == "" {
		opts.Host = leasecore.Hostname()
	}
	if opts.DaemonID == "" {
		opts.DaemonID = opts.Host
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = DefaultSessionTTL
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: opts.CallTimeout,
		// Detect a dead connection within about a call timeout.
		DialKeepAliveTime:    opts.CallTimeout,
		DialKeepAliveTimeout: opts.CallTimeout,
		TLS:                  opts.TLS,
		Username:             opts.Username,
		Password:             opts.Password,
		Logger:               zap.NewNop(),
		Context:              context.Background(),
		DialOptions:          opts.DialOptions,
	})
	if err != nil {
		return nil, fmt.Errorf("etcdstore: connect to %s: %w", strings.Join(endpoints, ","), err)
	}
	bg, cancel := context.WithCancel(context.Background())
	s := &Store{
		cli: cli, opts: opts, k: keys(prefix), bootID: leasecore.BootID(),
		ttl: int64((opts.LeaseDuration + time.Second - 1) / time.Second),
		bg:  bg, cancel: cancel, kick: make(chan struct{}, 1),
		known: make(map[string]*known), live: make(map[string]*rec),
		handles: make(map[string]*handle), previous: make(map[string]string),
		bucketKick: make(chan struct{}, 1),
		waiting:    make(map[string]int), perUID: make(map[uint32]int),
		queue:   make(map[string]map[string]int64),
		changed: make(map[string]chan struct{}),
		health:  leasecore.Health{Reachable: true},
	}
	if err := s.start(ctx); err != nil {
		cancel()
		cli.Close()
		return nil, err
	}
	return s, nil
}

// start loads the live leases and the waiter keys, grants the handle
// session, keeps the handle leases of this daemon's predecessor that a
// process still holds and ends the others, grants the session lease of
// waiter keys and starts the watch, the reaper and the keep-alives.
func (s *Store) start(ctx context.Context) error {
	cctx, done := s.call(ctx)
	resp, err := s.cli.Txn(cctx).Then(
		clientv3.OpGet(s.k.livePrefix(""), clientv3.WithPrefix()),
		clientv3.OpGet(s.k.waitersAll(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	done()
	if err != nil {
		return s.openError(ctx, err)
	}
	s.rev = resp.Header.Revision
	var stale []*rec
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		r, err := s.decode(kv, true)
		if err != nil {
			s.opts.Logger.Warn("ignoring a malformed lease key", "key", string(kv.Key), "err", err)
			continue
		}
		s.setLive(r)
		if r.l.Mode == leasecore.ModeHandle && r.l.Host == s.opts.Host && r.daemon == s.opts.DaemonID {
			stale = append(stale, r)
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		_, resource := s.k.classify(string(kv.Key))
		s.waiting[resource]++
		s.enqueue(resource, string(kv.Key), kv.CreateRevision)
	}
	s.watched = s.rev
	if s.opts.ReadOnly {
		// A reader only shows what the daemon keeps (§2): it changes
		// nothing in the cluster.
		for _, r := range stale {
			if pids := s.holders(r.l); len(pids) > 0 {
				s.previous[r.l.ID] = leasecore.FormatPIDs(pids)
			}
		}
		from := s.rev
		s.wg.Go(func() { s.watch(from) })
		return nil
	}
	if err := s.grantHandleSession(ctx); err != nil {
		return fmt.Errorf("etcdstore: grant the handle session: %w", err)
	}
	for _, r := range stale {
		// A handle lease lives while its open file does, whoever serves
		// it (docs/PROTOCOL.md §2): one still held is kept alive again,
		// the others are ended.
		reason := "handle lease of a previous daemon"
		if pids := s.holders(r.l); len(pids) > 0 {
			kept, err := s.resumeKeepAlive(ctx, r)
			if err != nil {
				return err
			}
			if kept {
				s.mu.Lock()
				if h := s.handles[r.l.ID]; h != nil {
					h.previous = leasecore.FormatPIDs(pids)
				}
				s.mu.Unlock()
				continue
			}
			reason = "its etcd lease expired while no daemon kept it alive"
		}
		if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err != nil && !errors.Is(err, errRaced) {
			return err
		}
		s.opts.Logger.Info("lease ended", "resource", r.l.Resource, "lease", r.l.ID,
			"status", leasecore.StatusAbandoned, "reason", reason)
	}
	ka, err := s.grantSession(ctx)
	if err != nil {
		return err
	}
	from := s.rev // before any goroutine can change it
	s.wg.Go(func() { s.keepSession(ka) })
	s.wg.Go(s.keepHandles)
	s.wg.Go(s.keepBuckets)
	s.wg.Go(s.reaper)
	s.wg.Go(func() { s.watch(from) })
	return nil
}

// openError explains the first call of Open that failed: which endpoints
// did not answer within how long, and what to check.
func (s *Store) openError(ctx context.Context, err error) error {
	eps := strings.Join(s.cli.Endpoints(), ",")
	if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded || status.Code(err) == codes.Unavailable) {
		return fmt.Errorf("etcdstore: no etcd member at %s answered within %s (%w): check that etcd runs there "+
			"and listens on those client URLs, and the TLS and credential flags", eps, s.opts.CallTimeout, err)
	}
	return fmt.Errorf("etcdstore: read the live leases under %s from %s: %w", s.k, eps, err)
}

// holders returns the processes that still hold the open file of handle
// lease l ([leasecore.Options.HandleHolders]).
func (s *Store) holders(l leasecore.Lease) []int {
	if s.opts.HandleHolders == nil {
		return nil
	}
	return s.opts.HandleHolders(l)
}

// resumeKeepAlive keeps alive again handle lease r, left by a previous
// daemon of this identity whose open file a process still holds
// (docs/PROTOCOL.md §2, §8a), and reports whether the cluster still had
// its etcd lease: a daemon back within the TTL of the last keep-alive
// keeps the lease, one away longer finds it expired. A lease kept is moved
// to this store's handle session in one transaction; the old etcd lease
// then expires on its own.
func (s *Store) resumeKeepAlive(ctx context.Context, r *rec) (bool, error) {
	lid := clientv3.LeaseID(r.kv.Lease)
	if lid == 0 {
		return false, nil
	}
	cctx, done := s.call(ctx)
	resp, err := s.cli.KeepAliveOnce(cctx, lid)
	done()
	if err != nil || resp.TTL <= 0 {
		return false, nil
	}
	session, err := s.handleSession()
	if err != nil {
		return false, err
	}
	if _, err := s.put(ctx, r, r.l, r.change, session); err != nil {
		if errors.Is(err, errRaced) || errors.Is(err, leasecore.ErrInactive) {
			return false, nil
		}
		return false, err
	}
	s.keepAlive(r.l.ID)
	s.opts.Logger.Info("handle lease kept", "resource", r.l.Resource, "lease", r.l.ID,
		"generation", r.l.Generation, "reason", "a process still holds the open file it was locked on")
	return true, nil
}

// grantSession grants a new session lease for waiter keys and starts its
// keep-alive.
func (s *Store) grantSession(ctx context.Context) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	cctx, done := s.call(ctx)
	g, err := s.cli.Grant(cctx, int64((s.opts.SessionTTL+time.Second-1)/time.Second))
	done()
	if err != nil {
		return nil, fmt.Errorf("etcdstore: grant the session lease: %w", err)
	}
	ka, err := s.cli.KeepAlive(s.bg, g.ID)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: keep the session lease alive: %w", err)
	}
	s.mu.Lock()
	s.session = g.ID
	s.mu.Unlock()
	return ka, nil
}

// keepSession drains the session's keep-alive until the store closes;
// when the session is lost (the cluster was unreachable past its TTL, and
// with it this store's waiter keys), it grants a new one, retrying each
// second. Blocked Acquires find their waiter key gone and queue again.
func (s *Store) keepSession(ka <-chan *clientv3.LeaseKeepAliveResponse) {
	for {
		for range ka {
		}
		for {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing || s.bg.Err() != nil {
				return
			}
			var err error
			if ka, err = s.grantSession(s.bg); err == nil {
				s.opts.Logger.Warn("the etcd session of waiter keys was lost and granted again")
				break
			}
			select {
			case <-s.bg.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// sessionID returns the current session lease.
func (s *Store) sessionID() clientv3.LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session
}

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

// cutOff counts a call that the cluster did not answer and, when the store
// had the cluster until then, logs the one line that says it is gone.
func (s *Store) cutOff(op, key string, err error) {
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
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.health
}

// begin checks the store is open, and writable when write.
func (s *Store) begin(write bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return leasecore.ErrClosed
	case write && s.opts.ReadOnly:
		return leasecore.ErrReadOnly
	}
	return nil
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

// encode renders a lease key's value: the record and this store's extra
// keys.
func (s *Store) encode(l leasecore.Lease, hash, change string, d time.Duration) string {
	l.ExpiresAt, l.Waiters = time.Time{}, 0
	var b strings.Builder
	b.Write(leasecore.EncodeRecord(&l, hash))
	b.WriteString("leasefs_change = " + leasecore.QuoteTOML(change) + "\n")
	b.WriteString("leasefs_daemon = " + leasecore.QuoteTOML(s.opts.DaemonID) + "\n")
	if d > 0 {
		b.WriteString("leasefs_lease_duration = " + leasecore.QuoteTOML(d.String()) + "\n")
	}
	return b.String()
}

// durationOf returns the lease duration of r: the one its reserving
// daemon recorded (every mount of a cluster may run with its own
// --lease-duration), else this store's.
func (s *Store) durationOf(r *rec) time.Duration {
	if r.duration > 0 {
		return r.duration
	}
	return s.opts.LeaseDuration
}

// decode parses a lease key; a live key takes its generation from its
// create revision.
func (s *Store) decode(kv *mvccpb.KeyValue, live bool) (*rec, error) {
	if live {
		// The generation is the revision of the reservation, known only
		// once it committed: the live record carries 0.
		l, hash, err := leasecore.DecodeRecord(kv.Value)
		if err != nil {
			return nil, err
		}
		l.Generation = uint64(kv.CreateRevision)
		r := &rec{l: l, hash: hash, kv: kv}
		s.decodeExtra(r)
		return r, nil
	}
	l, hash, err := leasecore.DecodeRecord(kv.Value)
	if err != nil {
		return nil, err
	}
	r := &rec{l: l, hash: hash, kv: kv}
	s.decodeExtra(r)
	return r, nil
}

func (s *Store) decodeExtra(r *rec) {
	var x extra
	if _, err := toml.Decode(string(r.kv.Value), &x); err == nil {
		r.change, r.daemon = x.Change, x.Daemon
		if d, err := time.ParseDuration(x.Duration); err == nil && d > 0 {
			r.duration = d
		}
	}
}

// setLive records r as the live lease of its resource, unless this store
// already knows a later version of that key (by mod revision), and
// remembers it. Its own transactions, its reads and its watch all feed it,
// so that a read through an open descriptor can answer from what the
// daemon has learned (docs/PROTOCOL.md §3, §8a). The caller holds mu.
func (s *Store) setLive(r *rec) {
	if cur := s.live[r.l.Resource]; cur != nil {
		if cur.kv.ModRevision > r.kv.ModRevision {
			return
		}
		s.perUID[cur.l.HolderUID]--
	}
	s.live[r.l.Resource] = r
	s.perUID[r.l.HolderUID]++
	s.remember(r)
}

// dropLive forgets the live lease of resource that a delete at revision
// rev removed, unless this store knows a later version of the key. The
// caller holds mu.
func (s *Store) dropLive(resource string, rev int64) {
	if cur := s.live[resource]; cur != nil && cur.kv.ModRevision < rev {
		delete(s.live, resource)
		if s.perUID[cur.l.HolderUID]--; s.perUID[cur.l.HolderUID] <= 0 {
			delete(s.perUID, cur.l.HolderUID)
		}
	}
}

// remember records what the store saw of a live lease.
func (s *Store) remember(r *rec) {
	k := s.known[r.l.ID]
	if k == nil {
		k = &known{resource: r.l.Resource}
		s.known[r.l.ID] = k
	}
	k.last = r.l
	if !k.hb.Equal(r.l.HeartbeatAt) {
		k.hb, k.hbMono = r.l.HeartbeatAt, s.opts.Clock.Mono()
	}
}

// deadReason applies the liveness rules to a live lease: a handle lease
// this store keeps alive ends at its local deadline ([Store.keepAlive]);
// rule 1 on this
// store's monotonic clock from when it first saw the current heartbeat
// (the etcd lease TTL, which the cluster enforces, fires no later up to
// clock drift: see docs/PROTOCOL.md §8a), and rules 2 and 3 only for
// leases recorded by this host. The caller holds mu.
func (s *Store) deadReason(r *rec) string {
	s.remember(r)
	k := s.known[r.l.ID]
	switch {
	case k.lost:
		return "keep-alive lost"
	case s.handles[r.l.ID] != nil && !time.Now().Before(s.hs.deadline):
		return "keep-alive not confirmed before the local deadline"
	case r.l.Mode == leasecore.ModeToken && s.opts.Clock.Mono()-k.hbMono >= s.durationOf(r):
		return "heartbeat expired"
	case r.l.Host != s.opts.Host:
		return ""
	}
	return leasecore.LocalDeadReason(r.l, s.bootID)
}

// snapshot returns the lease of r as callers see it: derived expiry and
// waiters filled, and a dead lease shown as it will be recorded,
// abandoned. The caller holds mu.
func (s *Store) snapshot(r *rec, waiters int64) leasecore.Lease {
	l := r.l
	if l.Status == leasecore.StatusActive && s.deadReason(r) != "" {
		s.wakeReaper()
		l.Status = leasecore.StatusAbandoned
		l.CompletedAt = s.opts.Clock.Now().UTC()
		return l
	}
	s.fill(&l, s.durationOf(r))
	if l.Status == leasecore.StatusActive {
		l.Waiters = int(waiters)
		if h := s.handles[l.ID]; h != nil {
			l.KeepAliveUntil = s.hs.deadline.UTC().Truncate(time.Millisecond)
			if h.previous != "" {
				l.Daemon, l.HolderPIDs = leasecore.DaemonPrevious, h.previous
			}
		} else if pids := s.previous[l.ID]; pids != "" {
			l.Daemon, l.HolderPIDs = leasecore.DaemonPrevious, pids
		}
	}
	return l
}

// fill sets ExpiresAt from the heartbeat, the mode and the lease's
// duration d.
func (s *Store) fill(l *leasecore.Lease, d time.Duration) {
	l.ExpiresAt = time.Time{}
	if l.Mode == leasecore.ModeToken && l.Status == leasecore.StatusActive {
		l.ExpiresAt = l.HeartbeatAt.Add(d)
	}
}

func (s *Store) wakeReaper() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// LeaseDuration returns the heartbeat TTL of token leases. Safe for
// concurrent use.
func (s *Store) LeaseDuration() time.Duration { return s.opts.LeaseDuration }

// nsValue is the value of a namespace key.
type nsValue struct {
	UID       uint32    `json:"uid"`
	GID       uint32    `json:"gid"`
	CreatedAt time.Time `json:"created_at"`
}

func decodeNS(path string, v []byte) leasecore.Namespace {
	var n nsValue
	_ = json.Unmarshal(v, &n)
	return leasecore.Namespace{Path: path, UID: n.UID, GID: n.GID, CreatedAt: n.CreatedAt.UTC()}
}

// isLeaseGone reports whether err says the etcd lease no longer exists.
func isLeaseGone(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || strings.Contains(err.Error(), rpctypes.ErrLeaseNotFound.Error())
}

func uidString(uid uint32) string { return strconv.FormatUint(uint64(uid), 10) }
