package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/internal/retrylog"
	"github.com/leasefs/leasefs/leasecore"
)

// Options configure an [Engine]: the options every store takes, and
// NoDaemon, which only a store of a state directory sets.
type Options struct {
	leasecore.Options
	// NoDaemon, with ReadOnly, says that no daemon serves the directory:
	// handle leases of this host are then reported dead, unless
	// HandleHolders finds a process holding their open file
	// (docs/PROTOCOL.md §2).
	NoDaemon bool
}

// Persister makes the changes of an [Engine] durable (a store's medium:
// the file store's journal and records; nothing for [MemStore]). Its
// methods, but for Await, are called with the engine's lock held, and must
// not call back into the engine but through its [Seam]. A change it
// accepts is visible to readers of its files at once and durable once
// Await returns (group commit, docs/ARCHITECTURE.md "Group commit in the
// file store").
type Persister interface {
	// WriteRecord replaces the record of l and its token hash (a record
	// of docs/PROTOCOL.md §4.3). Errors: a *leasecore.PersistError; the
	// change did not happen.
	WriteRecord(l *leasecore.Lease, tokenHash string) error
	// RemoveRecords deletes the records of pruned leases.
	RemoveRecords(ids []string) error
	// SaveGeneration records the generation high-water mark g.
	SaveGeneration(g uint64) error
	// SaveNamespaces replaces the set of namespaces, by path.
	SaveNamespaces(nss map[string]leasecore.Namespace) error
	// Await returns once every change persisted so far is durable,
	// reporting whether it had to wait for a commit. It is the one method
	// called without the engine's lock. Errors: a *leasecore.PersistError
	// with Op "sync" (the outcome is unknown) when a commit failed.
	Await() (waited bool, err error)
	// PublishWaiters tells readers of the store how many flock waiters
	// each resource has; advisory, never fails.
	PublishWaiters(counts map[string]int)
	// Close releases the persister's files; called once, by
	// [Engine.Close], with the lock held.
	Close()
}

// Record is the in-memory state of one lease: its lease as recorded and
// its token hash (docs/PROTOCOL.md §4.3). A persister makes Records while
// it loads its medium; one handed to [Seam.Add] is the engine's, guarded by
// its lock, and is never touched by the persister again.
type Record struct {
	Lease leasecore.Lease
	Hash  string
	// Stamp is the persister's own per-record state, kept here so that a
	// persister of 100,000 records needs no second index: the file store's
	// stamp of the record file as last written or read (zero: none).
	Stamp Stamp
	// hbMono is the heartbeat on the engine's monotonic clock.
	hbMono time.Duration
}

// Stamp is 32 bytes that a [Persister] keeps with a record ([Record.Stamp],
// [Seam.SetStamp]); the engine never reads them.
type Stamp [4]uint64

// Engine is the lease engine shared by the file store and [MemStore]: the
// index of leases and namespaces, the liveness rules of docs/PROTOCOL.md
// §5, the wait queues of §6, the change feed and the reaper. It
// implements [leasecore.Store] over a [Persister]. Its methods are safe for
// concurrent use.
//
// Lock order (docs/ARCHITECTURE.md "Locks and their order"): mu first, then
// the persister's locks, then the feed's and the subscribers' locks
// (publishing under mu only appends to queues). Nothing is called back with
// mu held but the persister.
type Engine struct {
	mu      sync.Mutex
	opts    Options
	persist Persister
	bootID  string
	closed  bool

	leases     map[string]*Record // by lease id, every loaded record
	live       map[string]*Record // by resource, active leases only
	perUID     map[uint32]int     // live leases per holder uid
	namespaces map[string]leasecore.Namespace
	queues     waitQueues
	// served counts the waiters of the daemon serving the directory, for
	// a read-only store ("leasefs ls"; [Seam.SetServed]).
	served map[string]int
	// unsynced holds leases ended in memory whose record could not be
	// written yet (see endLocked).
	unsynced       map[string]*Record
	syncTries      retrylog.Tries // the reaper's failed writes of unsynced
	highGeneration uint64         // highest generation granted
	// settling is true while the store's start ends the active records a
	// previous daemon left, whose ends endLocked logs at INFO.
	settling bool
	// dirtySince is when the oldest change not yet reported to
	// Options.OnCommit began (zero: none).
	dirtySince time.Time

	feed leasecore.Feed
	// kick wakes the reaper early: a read found a dead lease.
	kick chan struct{}
	// stopReaper ends the reaper goroutine; reaped is closed when it has.
	stopReaper context.CancelFunc
	reaped     chan struct{}
}

var (
	_ leasecore.Store      = (*Engine)(nil)
	_ leasecore.LiveLister = (*Engine)(nil)
)

// New returns an empty engine over p with opts, whose zero fields must
// already hold their defaults ([leasecore.Options.WithDefaults]), and the
// [Seam] through which p's store loads it and reaches its lock. No reaper
// runs until [Seam.StartReaper].
func New(opts Options, p Persister) (*Engine, Seam) {
	s := &Engine{
		opts:       opts,
		persist:    p,
		bootID:     procfs.BootID(),
		leases:     make(map[string]*Record),
		live:       make(map[string]*Record),
		perUID:     make(map[uint32]int),
		namespaces: make(map[string]leasecore.Namespace),
		queues:     make(waitQueues),
		unsynced:   make(map[string]*Record),
		kick:       make(chan struct{}, 1),
	}
	if opts.OnCommit != nil {
		s.persist = markingPersister{Persister: p, s: s}
	}
	return s, Seam{s}
}

// unlock releases mu and returns once every change made so far is durable,
// so that no caller learns of a change (its own or another's) that a crash
// could still undo (docs/PROTOCOL.md §4.3). A failed commit replaces a nil
// *err with its *PersistError (the outcome is unknown). It reports the
// commit to Options.OnCommit. Deferred by every method that took mu through
// begin.
func (s *Engine) unlock(err *error) {
	since := s.dirtySince
	s.dirtySince = time.Time{}
	s.mu.Unlock()
	_, werr := s.persist.Await()
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
func (s *Engine) fillExpiry(l *leasecore.Lease) {
	l.ExpiresAt = time.Time{}
	if l.Mode == leasecore.ModeToken && l.Status == leasecore.StatusActive {
		l.ExpiresAt = l.HeartbeatAt.Add(s.opts.LeaseDuration)
	}
}

func (s *Engine) addLive(e *Record) {
	s.live[e.Lease.Resource] = e
	s.perUID[e.Lease.HolderUID]++
}

func (s *Engine) dropLive(e *Record) {
	if s.live[e.Lease.Resource] == e {
		delete(s.live, e.Lease.Resource)
		if s.perUID[e.Lease.HolderUID]--; s.perUID[e.Lease.HolderUID] <= 0 {
			delete(s.perUID, e.Lease.HolderUID)
		}
	}
}

// deadReason applies the liveness rules of docs/PROTOCOL.md §5 to an active
// lease and returns why it is dead, or "" when it is live. The pid and
// boot-id rules apply only to leases of this host (§8a).
func (s *Engine) deadReason(e *Record) string {
	l := &e.Lease
	local := l.Host == s.opts.Host
	switch {
	case l.Status != leasecore.StatusActive:
		return "ended"
	case l.Mode == leasecore.ModeHandle && local && s.opts.ReadOnly && s.opts.NoDaemon && l.Daemon != leasecore.DaemonPrevious:
		return "no daemon holds its open file, nor any process one of a previous daemon"
	case l.Mode == leasecore.ModeToken && s.opts.Clock.Mono()-e.hbMono >= s.opts.LeaseDuration:
		return "heartbeat expired"
	case !local:
		return ""
	}
	return leasecore.LocalDeadReason(*l, s.bootID)
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
func (s *Engine) endLocked(e *Record, l leasecore.Lease, status leasecore.Status, change leasecore.Change, reason string, deferrable bool) error {
	l.Status = status
	l.CompletedAt = s.opts.Clock.Now().UTC()
	s.fillExpiry(&l)
	err := s.persist.WriteRecord(&l, e.Hash)
	if err != nil {
		if !deferrable {
			return err
		}
		s.unsynced[l.ID] = e
		s.opts.Logger.Warn("lease ended in memory; its record will be written when the disk allows",
			"resource", l.Resource, "lease", l.ID, "err", err)
	}
	s.dropLive(e)
	e.Lease = l
	if status == leasecore.StatusAbandoned {
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
	s.feed.Publish(0, leasecore.Event{Kind: leasecore.EventEnded, Change: change, Lease: s.snapshot(e)})
	s.handOff(l.Resource)
	return nil
}

// handOff grants a free resource to its first waiter (docs/PROTOCOL.md §6:
// first come, first served): it reserves the name for the head waiter's
// draft under the same hold of mu that freed it, so no other caller can
// take the name in between, and wakes the waiter with the outcome. A head
// whose reservation fails (its uid's quota, a namespace gone) is woken with
// the error and the next one is tried. The caller holds mu.
func (s *Engine) handOff(resource string) {
	for {
		w := s.queues.head(resource)
		if w == nil || s.live[resource] != nil || s.closed {
			return
		}
		g, err := s.reserveLocked(w.draft)
		if errors.Is(err, leasecore.ErrHeld) {
			return // ended a dead lease that handed off in turn
		}
		s.queues.remove(resource, w)
		s.persist.PublishWaiters(s.queues.counts())
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
func (s *Engine) syncLocked() error {
	for id, e := range s.unsynced {
		err := s.persist.WriteRecord(&e.Lease, e.Hash)
		if err != nil {
			return err
		}
		delete(s.unsynced, id)
	}
	return nil
}

// checkLive ends e if it is dead, for a method that changes the store. It
// reports whether e is live. The caller holds mu.
func (s *Engine) checkLive(e *Record) (bool, error) {
	reason := s.deadReason(e)
	if reason == "" {
		return true, nil
	}
	if e.Lease.Status != leasecore.StatusActive || s.opts.ReadOnly {
		return false, nil
	}
	return false, s.endLocked(e, e.Lease, leasecore.StatusAbandoned, leasecore.ChangeExpired, reason, true)
}

// alive reports whether e is live, for a method that only reads: a dead
// lease is left for the reaper, which is woken to end it. The caller holds
// mu.
func (s *Engine) alive(e *Record) bool {
	reason := s.deadReason(e)
	if reason != "" && e.Lease.Status == leasecore.StatusActive && !s.opts.ReadOnly {
		s.wakeReaper()
	}
	return reason == ""
}

// view returns the lease of e as a reader sees it: a lease that is dead
// but not yet ended by the reaper is shown as it will be recorded,
// abandoned. The caller holds mu.
func (s *Engine) view(e *Record) leasecore.Lease {
	l := s.snapshot(e)
	if l.Status == leasecore.StatusActive && !s.alive(e) {
		l.Status = leasecore.StatusAbandoned
		l.CompletedAt = s.opts.Clock.Now().UTC()
		l.ExpiresAt, l.Waiters = time.Time{}, 0
	}
	return l
}

// LeaseDuration returns the heartbeat TTL of token leases. Safe for
// concurrent use.
func (s *Engine) LeaseDuration() time.Duration { return s.opts.LeaseDuration }

// Close stops the reaper, ends every change feed and releases the store's
// files. Further calls return ErrClosed. Safe for concurrent use; a second
// Close is a no-op.
func (s *Engine) Close() error {
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
	s.persist.Close()
	return nil
}

// begin takes mu and checks the store is open (and writable when write).
func (s *Engine) begin(write bool) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return leasecore.ErrClosed
	case write && s.opts.ReadOnly:
		s.mu.Unlock()
		return leasecore.ErrReadOnly
	}
	return nil
}

// snapshot copies the lease of e with its derived fields. The caller holds
// mu.
func (s *Engine) snapshot(e *Record) leasecore.Lease {
	l := e.Lease
	s.fillExpiry(&l)
	if l.Status == leasecore.StatusActive {
		l.Waiters = s.queues.count(l.Resource) + s.served[l.Resource]
	}
	return l
}
