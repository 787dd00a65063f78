package leasecore

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/internal/retrylog"
)

// Options configure [OpenFileStore] and [NewMemStore]. The zero value works:
// every zero field takes its documented default.
type Options struct {
	// LeaseDuration is the heartbeat TTL of token leases; default
	// [DefaultLeaseDuration], or for a ReadOnly file store the duration the
	// directory was last served with.
	LeaseDuration time.Duration
	// HistoryKeep is how many ended records are kept; default
	// [DefaultHistoryKeep]. Older ones are pruned by the reaper.
	HistoryKeep int
	// MaxLeasesPerUID bounds live leases per holder uid; default
	// [DefaultMaxLeasesPerUID].
	MaxLeasesPerUID int
	// ReapInterval is how often the store's reaper ends dead leases;
	// default a tenth of the lease duration, clamped to [50ms, 1s]. A read
	// that finds a dead lease wakes the reaper at once.
	ReapInterval time.Duration
	// Clock is the time source; default [NewSystemClock].
	Clock Clock
	// Host is recorded as the lease host and is the daemon identity of
	// handle leases; default [procfs.Hostname]. The pid and boot-id liveness rules
	// apply only to leases recorded by this host (docs/PROTOCOL.md §8a).
	Host string
	// ReadOnly opens the store for reading under a shared lock: nothing is
	// written, no reaper runs, and mutating methods return ErrReadOnly.
	// Used by "leasefs ls" and "history".
	ReadOnly bool
	// NoDaemon, with ReadOnly, says that no daemon serves the directory:
	// handle leases of this host are then reported dead, unless
	// HandleHolders finds a process holding their open file
	// (docs/PROTOCOL.md §2).
	NoDaemon bool
	// HandleHolders, when set, is asked at open about each active handle
	// lease of this host (a previous daemon's) and returns the processes
	// that still hold the open file it was locked on: the lease is kept,
	// marked [DaemonPrevious] with those [Lease.HolderPIDs] (a ReadOnly
	// store only marks it). None, or no
	// HandleHolders, ends it as abandoned ("handle lease of a previous
	// daemon"). docs/PROTOCOL.md §2, "Handle leases across restarts". It is
	// called during open, before the store is returned, and must not call
	// the store.
	HandleHolders func(Lease) []int
	// Logger receives one line per record that could not be loaded and per
	// lease ended by a liveness rule; default slog.Default().
	Logger *slog.Logger
	// OnCommit, when set, is called once for every store call that made a
	// durable change (a record written or removed, the generation mark or
	// the namespaces saved), with how long the change took from its first
	// write to being durable (its journal commit included), measured on the
	// real clock whatever Clock is. Failed changes are not reported. It is
	// called on the caller's goroutine without the store's lock; it must
	// return quickly and must not call the store.
	OnCommit func(d time.Duration)
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.HistoryKeep <= 0 {
		o.HistoryKeep = DefaultHistoryKeep
	}
	if o.MaxLeasesPerUID <= 0 {
		o.MaxLeasesPerUID = DefaultMaxLeasesPerUID
	}
	if o.ReapInterval <= 0 {
		o.ReapInterval = min(max(o.LeaseDuration/10, 50*time.Millisecond), time.Second)
	}
	if o.Clock == nil {
		o.Clock = NewSystemClock()
	}
	if o.Host == "" {
		o.Host = procfs.Hostname()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// persister makes the changes of a [store] durable. Its methods, but for
// await, are called with the store's mutex held, and must not call back
// into the store. A change it accepts is visible to readers of its files at
// once and durable once await returns (group commit, docs/ARCHITECTURE.md).
type persister interface {
	// writeRecord replaces the record of l durably and returns the stamp
	// of the file written (zero for a store without record files).
	writeRecord(l *Lease, tokenHash string) (recordStamp, error)
	// removeRecords deletes the records of pruned leases durably.
	removeRecords(ids []string) error
	// saveGeneration records the generation high-water mark g durably.
	saveGeneration(g uint64) error
	// saveNamespaces replaces the set of namespaces durably.
	saveNamespaces(nss map[string]Namespace) error
	// await returns once every change persisted so far is durable,
	// reporting whether it had to wait for a commit. It is the one method
	// called without the store's mutex. Errors: a *PersistError with Op
	// "sync" (the outcome is unknown) when a commit failed.
	await() (waited bool, err error)
	// publishWaiters tells readers of the store how many flock waiters
	// each resource has; advisory, never fails.
	publishWaiters(counts map[string]int)
	// close releases the persister's files.
	close()
}

// entry is the in-memory state of one record.
type entry struct {
	lease Lease
	hash  string
	// hbMono is the heartbeat on the store's monotonic clock.
	hbMono time.Duration
	// stamp is the stamp of the record file as last written or read; the
	// record cache holds lease only while it encodes to that content.
	stamp recordStamp
}

// store is the lease engine shared by [FileStore] and [MemStore]: the index
// of leases and namespaces, the liveness rules, the wait queues, the change
// feed and the reaper. Its methods are safe for concurrent use.
//
// Lock order: mu, then the feed's and the subscribers' locks (publishing
// under mu only appends to queues). Nothing is called back with mu held.
type store struct {
	mu      sync.Mutex
	opts    Options
	persist persister
	bootID  string
	closed  bool

	leases     map[string]*entry // by lease id, every loaded record
	live       map[string]*entry // by resource, active leases only
	perUID     map[uint32]int    // live leases per holder uid
	namespaces map[string]Namespace
	queues     waitQueues
	// served counts the waiters of the daemon serving the directory, for
	// a read-only store ("leasefs ls"); see waitersName.
	served map[string]int
	// unsynced holds leases ended in memory whose record could not be
	// written yet (see endLocked).
	unsynced       map[string]*entry
	syncTries      retrylog.Tries // the reaper's failed writes of unsynced
	highGeneration uint64         // highest generation granted
	// settling is true while the store's start ends the active records a
	// previous daemon left, whose ends endLocked logs at INFO.
	settling bool
	// dirtySince is when the oldest change not yet reported to
	// Options.OnCommit began (zero: none).
	dirtySince time.Time

	feed Feed
	// kick wakes the reaper early: a read found a dead lease.
	kick chan struct{}
	// stopReaper ends the reaper goroutine; reaped is closed when it has.
	stopReaper context.CancelFunc
	reaped     chan struct{}
}

func newStore(opts Options, disk persister) *store {
	s := &store{
		opts:       opts,
		persist:    disk,
		bootID:     procfs.BootID(),
		leases:     make(map[string]*entry),
		live:       make(map[string]*entry),
		perUID:     make(map[uint32]int),
		namespaces: make(map[string]Namespace),
		queues:     make(waitQueues),
		unsynced:   make(map[string]*entry),
		kick:       make(chan struct{}, 1),
	}
	if opts.OnCommit != nil {
		s.persist = markingPersister{persister: disk, s: s}
	}
	return s
}

// unlock releases mu and returns once every change made so far is durable,
// so that no caller learns of a change (its own or another's) that a crash
// could still undo (docs/PROTOCOL.md §4.3). A failed commit replaces a nil
// *err with its *PersistError (the outcome is unknown). It reports the
// commit to Options.OnCommit. Deferred by every method that took mu through
// begin.
func (s *store) unlock(err *error) {
	since := s.dirtySince
	s.dirtySince = time.Time{}
	s.mu.Unlock()
	_, werr := s.persist.await()
	if werr != nil {
		if *err == nil {
			*err = werr
		}
		return
	}
	if !since.IsZero() && *err == nil && s.opts.OnCommit != nil {
		s.opts.OnCommit(time.Since(since))
	}
}

// fillExpiry sets ExpiresAt from the heartbeat and mode.
func (s *store) fillExpiry(l *Lease) {
	l.ExpiresAt = time.Time{}
	if l.Mode == ModeToken && l.Status == StatusActive {
		l.ExpiresAt = l.HeartbeatAt.Add(s.opts.LeaseDuration)
	}
}

func (s *store) addLive(e *entry) {
	s.live[e.lease.Resource] = e
	s.perUID[e.lease.HolderUID]++
}

func (s *store) dropLive(e *entry) {
	if s.live[e.lease.Resource] == e {
		delete(s.live, e.lease.Resource)
		if s.perUID[e.lease.HolderUID]--; s.perUID[e.lease.HolderUID] <= 0 {
			delete(s.perUID, e.lease.HolderUID)
		}
	}
}

// deadReason applies the liveness rules of docs/PROTOCOL.md §5 to an active
// lease and returns why it is dead, or "" when it is live. The pid and
// boot-id rules apply only to leases of this host (§8a).
func (s *store) deadReason(e *entry) string {
	l := &e.lease
	local := l.Host == s.opts.Host
	switch {
	case l.Status != StatusActive:
		return "ended"
	case l.Mode == ModeHandle && local && s.opts.ReadOnly && s.opts.NoDaemon && l.Daemon != DaemonPrevious:
		return "no daemon holds its open file, nor any process one of a previous daemon"
	case l.Mode == ModeToken && s.opts.Clock.Mono()-e.hbMono >= s.opts.LeaseDuration:
		return "heartbeat expired"
	case !local:
		return ""
	}
	return LocalDeadReason(*l, s.bootID)
}

// endLocked ends e with status, durably, recording it as l (e's lease,
// possibly with annotations applied), publishes the end as change
// (ChangeReleased or ChangeExpired) and wakes the resource's first waiter.
// The caller holds mu.
//
// When deferrable and the record cannot be written (disk full, read-only),
// the end still takes effect in memory and the record is written later by
// the reaper: this is safe for leases that would be ended again after a
// restart whatever the disk says, namely those dead by the liveness rules
// of docs/PROTOCOL.md §5. A lease released by its holder is not
// deferrable, nor is the end of a handle lease, which the next daemon
// keeps while its open file lives (§2): an unlock or an rm leaves the open
// file open, so only a durable end says it is over. Such an end fails and
// nothing changes.
func (s *store) endLocked(e *entry, l Lease, status Status, change Change, reason string, deferrable bool) error {
	l.Status = status
	l.CompletedAt = s.opts.Clock.Now().UTC()
	s.fillExpiry(&l)
	stamp, err := s.persist.writeRecord(&l, e.hash)
	if err != nil {
		if !deferrable {
			return err
		}
		s.unsynced[l.ID] = e
		s.opts.Logger.Warn("lease ended in memory; its record will be written when the disk allows",
			"resource", l.Resource, "lease", l.ID, "err", err)
	}
	s.dropLive(e)
	e.lease = l
	if err == nil {
		e.stamp = stamp
	}
	if status == StatusAbandoned {
		// An end is one lease's business (DEBUG), except the ends of a
		// previous daemon's leftovers at start, which report the restart
		// (docs/PROTOCOL.md §2, §8b "Logs").
		level := slog.LevelDebug
		if s.settling {
			level = slog.LevelInfo
		}
		s.opts.Logger.Log(context.Background(), level, "lease ended", "resource", l.Resource, "lease", l.ID,
			"generation", l.Generation, "status", status, "reason", reason)
	}
	s.feed.Publish(0, Event{Kind: EventEnded, Change: change, Lease: s.snapshot(e)})
	s.handOff(l.Resource)
	return nil
}

// handOff grants a free resource to its first waiter (docs/PROTOCOL.md §6:
// first come, first served): it reserves the name for the head waiter's
// draft under the same hold of mu that freed it, so no other caller can
// take the name in between, and wakes the waiter with the outcome. A head
// whose reservation fails (its uid's quota, a namespace gone) is woken with
// the error and the next one is tried. The caller holds mu.
func (s *store) handOff(resource string) {
	for {
		w := s.queues.head(resource)
		if w == nil || s.live[resource] != nil || s.closed {
			return
		}
		g, err := s.reserveLocked(w.draft)
		if errors.Is(err, ErrHeld) {
			return // ended a dead lease that handed off in turn
		}
		s.queues.remove(resource, w)
		s.persist.publishWaiters(s.queues.counts())
		if err == nil {
			g.Lease.Waiters = s.queues.count(resource)
		}
		w.done, w.grant, w.err = true, g, err
		w.signal()
		if err == nil {
			return
		}
	}
}

// syncLocked writes the records of leases ended in memory only. The caller
// holds mu.
func (s *store) syncLocked() error {
	for id, e := range s.unsynced {
		stamp, err := s.persist.writeRecord(&e.lease, e.hash)
		if err != nil {
			return err
		}
		e.stamp = stamp
		delete(s.unsynced, id)
	}
	return nil
}

// checkLive ends e if it is dead, for a method that changes the store. It
// reports whether e is live. The caller holds mu.
func (s *store) checkLive(e *entry) (bool, error) {
	reason := s.deadReason(e)
	if reason == "" {
		return true, nil
	}
	if e.lease.Status != StatusActive || s.opts.ReadOnly {
		return false, nil
	}
	return false, s.endLocked(e, e.lease, StatusAbandoned, ChangeExpired, reason, true)
}

// alive reports whether e is live, for a method that only reads: a dead
// lease is left for the reaper, which is woken to end it. The caller holds
// mu.
func (s *store) alive(e *entry) bool {
	reason := s.deadReason(e)
	if reason != "" && e.lease.Status == StatusActive && !s.opts.ReadOnly {
		s.wakeReaper()
	}
	return reason == ""
}

// view returns the lease of e as a reader sees it: a lease that is dead
// but not yet ended by the reaper is shown as it will be recorded,
// abandoned. The caller holds mu.
func (s *store) view(e *entry) Lease {
	l := s.snapshot(e)
	if l.Status == StatusActive && !s.alive(e) {
		l.Status = StatusAbandoned
		l.CompletedAt = s.opts.Clock.Now().UTC()
		l.ExpiresAt, l.Waiters = time.Time{}, 0
	}
	return l
}

// LeaseDuration returns the heartbeat TTL of token leases. Safe for
// concurrent use.
func (s *store) LeaseDuration() time.Duration { return s.opts.LeaseDuration }

// Close stops the reaper, ends every change feed and releases the store's
// files. Further calls return ErrClosed. Safe for concurrent use; a second
// Close is a no-op.
func (s *store) Close() error {
	if s.stopReaper != nil {
		s.stopReaper()
		<-s.reaped
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if !s.opts.ReadOnly {
		if err := s.syncLocked(); err != nil {
			s.opts.Logger.Warn("closing with ended leases not yet written", "count", len(s.unsynced), "err", err)
		}
	}
	s.closed = true
	s.queues.wakeAll()
	s.feed.Close()
	s.persist.close()
	return nil
}

// begin takes mu and checks the store is open (and writable when write).
func (s *store) begin(write bool) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case write && s.opts.ReadOnly:
		s.mu.Unlock()
		return ErrReadOnly
	}
	return nil
}

// snapshot copies the lease of e with its derived fields. The caller holds
// mu.
func (s *store) snapshot(e *entry) Lease {
	l := e.lease
	s.fillExpiry(&l)
	if l.Status == StatusActive {
		l.Waiters = s.queues.count(l.Resource) + s.served[l.Resource]
	}
	return l
}
