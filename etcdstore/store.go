// Package etcdstore is the etcd store of docs/PROTOCOL.md §8a: a
// [leasecore.Store] whose leases live in an etcd v3 cluster, so that
// leasefs mounts on many machines share one lease namespace and serve it
// with the same file protocol.
//
// A lease is the key PREFIX/live/<resource>, holding its record (the TOML
// of docs/PROTOCOL.md §4.3). Every change is one transaction whose compares
// decide it in the cluster and whose Else branch reads what stood in the
// way, so that no change reads first: a reservation succeeds only if the
// key does not exist, and its revision is the lease's generation (etcd
// revisions are cluster-wide and strictly increasing); a renewal compares
// the key's mod revision; an end deletes the key and writes the ended
// record under PREFIX/history/ in the same transaction. The key layout is
// documented on [keys] and in docs/PROTOCOL.md §8a.
//
// No etcd lease is granted per lease: token leases live on shared buckets
// (buckets.go) and handle leases on one handle session per daemon
// (keepalive.go). A
// handle lease ends for its store at the session's local deadline, which
// comes before etcd can expire it (docs/PROTOCOL.md §8a).
//
// The files cut the store by concern: open.go (Open and the sessions of a
// start), calls.go (bounding and failing cluster calls), reserve.go,
// change.go (renew, end), read.go (what each read asks the cluster),
// records.go (the record codec and the store's view of live leases),
// follow.go (the names a store follows, each on a watch of its own),
// watch.go (the events of those watches, and the watch of namespaces),
// echoes.go (the events of its own changes, and their echoes), queue.go
// (Acquire's first come, first served queue), buckets.go (the etcd leases
// of token leases), keepalive.go (the handle session), jeopardy.go,
// known.go, reaper.go and namespaces.go.
//
// Reads follow docs/PROTOCOL.md §3: a lookup is one linearizable read; a
// read through an open descriptor answers from the store's view, fed by
// its own transactions, the watches of the names it follows and its
// keep-alives.
package etcdstore

import (
	"context"
	"crypto/tls"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

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
	// that transaction's round trip); their defaults are
	// [leasecore.Options.WithDefaults]'s.
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
	// Grace is how long a handle lease stays in jeopardy after its local
	// deadline passes without a confirmed keep-alive before it ends
	// (docs/PROTOCOL.md §8a, "Elections and jeopardy"; Chubby's grace
	// period, Burrows, OSDI 2006, §2.8). The handle session's TTL in the
	// cluster is LeaseDuration + Grace, so that etcd cannot expire it
	// before the local end. 0 (the default of the library; "leasefs
	// mount" defaults it to the lease duration): no jeopardy, a handle
	// lease ends at its local deadline. Negative values count as 0.
	Grace time.Duration
	// OnJeopardy, when set, is called with the number of handle leases in
	// jeopardy each time it changes (from the keep-alive loop; it must
	// return quickly and not call the store). The mount records it for
	// "leasefs status" (docs/PROTOCOL.md §8).
	OnJeopardy func(inJeopardy int)
	// TLS, when set, is used to reach the cluster.
	TLS *tls.Config
	// Username and Password authenticate to the cluster when Username is
	// set.
	Username, Password string
	// KernelKnows, when set, reports whether the kernel of this daemon's
	// mount knows resource (an inode of it is in the mount's tree): the
	// store follows such a name, so that an end elsewhere reaches the
	// mount (docs/PROTOCOL.md §6a, §8a). It is called without the store's
	// locks held and must not call the store.
	KernelKnows func(resource string) bool
	// DialOptions are added to the gRPC options of the store's cluster
	// client: for example interceptors that count the calls each system
	// call costs (docs/ARCHITECTURE.md, "The etcd store").
	DialOptions []grpc.DialOption
}

// Store is a [leasecore.Store] kept in etcd. Safe for concurrent use.
type Store struct {
	cli    *clientv3.Client
	opts   Options
	k      keys
	bootID string
	ttl    int64 // of the handle session, seconds: lease duration + grace, rounded up

	bg     context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	feed   leasecore.Feed
	kick   chan struct{}
	// bucketKick wakes keepBuckets when a bucket is used.
	bucketKick chan struct{}

	session clientv3.LeaseID // of waiter keys; 0 for a read-only store

	// heard counts the changes of live and waiter keys the store's
	// watches delivered (tests: an idle daemon hears nothing).
	heard atomic.Int64

	// mu guards the fields below. Lock order and rules: mu is never held
	// across a cluster call, a log write or a wait; the feed's locks are
	// taken after it, never before; no other lock of this package is
	// taken under it (docs/ARCHITECTURE.md, "Locks and their order").
	mu      sync.Mutex
	closed  bool
	closing bool              // Close has begun: the session is not granted again
	rev     int64             // highest revision seen
	known   map[string]*known // lease id → what this store knows of it
	// follows: resource → this store's interest in the name and its
	// watch (follow.go); live and queue hold followed names only, so a
	// daemon's view, and what it hears, is the names it must act on
	// (docs/PROTOCOL.md §8a, "Changes from other mounts").
	follows map[string]*follow
	live    map[string]*rec    // resource → live lease, as the name's watch last showed it (a call's answer only until the watch shows a later change: [Store.learnLive])
	handles map[string]*handle // lease id → a handle lease this store keeps alive on hs
	hs      hsession           // the etcd lease of this store's handle leases
	// mine: the etcd leases of this daemon's token lease buckets (its own,
	// and its predecessor's found at start) → when they expire: a lease
	// on one is this daemon's own (see [Store.owns]).
	mine   map[clientv3.LeaseID]time.Time
	bucket bucket // the etcd lease of the token leases reserved or renewed now
	// queue: resource → waiter key → its create revision, from a read of
	// the name's waiter keys and its watch since (see [follow]); a
	// waiter's daemon decides from it alone whether its waiter is at the
	// head (see [Store.acquireOnce]).
	queue  map[string]map[string]int64
	pinned map[string]int // resource → calls of this store waiting on its changes (see [Store.pin])
	// writing: resource → changes of this store to its live key in
	// flight; writeIdle: closed when that drops to 0; own: resource →
	// revisions of this store's changes whose events it published itself
	// (see [Store.writeBegin]).
	writing   map[string]int
	writeIdle map[string]chan struct{}
	own       map[string][]int64
	// quotaFullAt: uid → when a reservation of uid was last refused for
	// its quota; its next ones within quotaHint read the count first
	// (see [Store.quotaFull]).
	quotaFullAt map[uint32]time.Time
	// nss: path → a namespace this store has learned exists (a read, its
	// own mkdir, the watch), until the watch shows it removed; lookups
	// and directory attributes answer from it with no round trip
	// (docs/PROTOCOL.md §8a, "Namespaces"). nsGone: path → the revision
	// of a removal the watch showed, so that an older answer does not
	// bring the namespace back; answers older than nsFloor are not
	// learned (nsGone was cleared then).
	nss     map[string]leasecore.Namespace
	nsGone  map[string]int64
	nsFloor int64
	// previous, of a read-only store: lease id → holder pids of the
	// handle leases of this store's daemon identity that a process holds
	// through a previous daemon's mount, found at open (docs/PROTOCOL.md
	// §2, "Handle leases across restarts"); shown as
	// [leasecore.Lease.Daemon] "previous" while the lease lives.
	previous map[string]string
	changed  map[string]chan struct{} // resource → closed at its next change
	ended    int                      // leases ended since the last prune
	health   leasecore.Health         // see [Store.Health]; its jeopardy counts are kept by keepHandles
	// electionWarned is when the store last logged a call refused by an
	// election (see [Store.cutOff]).
	electionWarned time.Time
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
	// published: the lease's end is published (by [Store.end] or
	// [Store.endedElsewhere]); goneAt: when its live key went, after
	// which it is forgotten (see [knownKeep]).
	published bool
	// recorded: this store wrote the lease's history record (its end's
	// transaction), which answers for it from then on.
	recorded bool
	goneAt   time.Time
}

// handle is one handle lease that this store keeps alive on its handle
// session ([hsession]), whose deadline is the lease's local end.
type handle struct {
	// previous, for a lease bound through a previous daemon's mount that
	// this store kept at its start, is [leasecore.Lease.HolderPIDs]; ""
	// once the lease binds to an open file of this daemon. Guarded by
	// Store.mu.
	previous string
	// jeopardy: the lease entered jeopardy with the handle session and is
	// still in it (docs/PROTOCOL.md §8a). Guarded by Store.mu.
	jeopardy bool
}

// localMargin is how long before the cluster could expire an etcd lease of
// TTL ttl this store considers it ended: max(ttl/3, 500 ms), and at most
// ttl/2. It covers the difference in clock rates between this host and the
// etcd leader and the time to publish the end (docs/PROTOCOL.md §8a).
func localMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/3, 500*time.Millisecond), ttl/2)
}

// keepAliveEvery is the cadence of a handle lease's keep-alives for a
// lease duration d: d/6, so that a healthy connection renews the local
// deadline (d − localMargin(d) after a send) several times over before it
// is reached.
func keepAliveEvery(d time.Duration) time.Duration { return d / 6 }

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
	chNoted    = "noted"
)

var changeOf = map[string]leasecore.Change{
	chReserved: leasecore.ChangeReserved, chRenewed: leasecore.ChangeRenewed,
	chBound: leasecore.ChangeBound, chTakeover: leasecore.ChangeTakeoverRequested,
	chReleased: leasecore.ChangeReleased, chExpired: leasecore.ChangeExpired,
	chNoted: leasecore.ChangeNoted,
}

// changeOr returns the leasecore change of a record's leasefs_change, or
// def when it names none.
func changeOr(change string, def leasecore.Change) leasecore.Change {
	if c := changeOf[change]; c != 0 {
		return c
	}
	return def
}

var _ leasecore.Store = (*Store)(nil)

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

func (s *Store) wakeReaper() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// LeaseDuration returns the heartbeat TTL of token leases. Safe for
// concurrent use.
func (s *Store) LeaseDuration() time.Duration { return s.opts.LeaseDuration }
