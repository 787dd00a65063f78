package engine

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/leasefs/leasefs/leasecore"
)

// Seam is the engine as its [Persister]'s store sees it: the engine's lock,
// for the store's background work that must not interleave with a change
// (a record flush, the record cache, a checkpoint), and the hooks that load
// the engine and read its records. [New] returns it beside the engine, so
// that it is no method of a store embedding the engine. Its methods but
// Lock and StartReaper need the lock held, or the engine to the caller
// alone (a store that is opening); lock order as at [Engine].
type Seam struct{ e *Engine }

// Lock takes the engine's lock.
func (h Seam) Lock() { h.e.mu.Lock() }

// Unlock releases the engine's lock.
func (h Seam) Unlock() { h.e.mu.Unlock() }

// Closed reports whether the engine is closed ([Engine.Close]).
func (h Seam) Closed() bool { return h.e.closed }

// Len returns the number of records, live and ended.
func (h Seam) Len() int { return len(h.e.leases) }

// IDs returns the lease ids of every record, in no order.
func (h Seam) IDs() []string {
	ids := make([]string, 0, len(h.e.leases))
	for id := range h.e.leases {
		ids = append(ids, id)
	}
	return ids
}

// Has reports whether the engine holds a record of lease id.
func (h Seam) Has(id string) bool { return h.e.leases[id] != nil }

// Lookup returns the lease of record id as recorded (ExpiresAt filled in)
// and its token hash; ok is false when there is none.
func (h Seam) Lookup(id string) (l leasecore.Lease, hash string, ok bool) {
	r := h.e.leases[id]
	if r == nil {
		return leasecore.Lease{}, "", false
	}
	return r.Lease, r.Hash, true
}

// HighGeneration returns the highest generation granted or loaded.
func (h Seam) HighGeneration() uint64 { return h.e.highGeneration }

// RaiseGeneration raises the generation high-water mark to g, a mark
// loaded from the medium, so that no generation is granted twice
// (docs/PROTOCOL.md §4.3).
func (h Seam) RaiseGeneration(g uint64) { h.e.highGeneration = max(h.e.highGeneration, g) }

// maxHeartbeatAge bounds the age of a loaded heartbeat on the monotonic
// clock: about 146 years, past every lease duration. An older one (a
// record's heartbeat_at of 1677, where time.Time.Sub saturates) would make
// "now minus heartbeat" overflow and wrap around to a lease that never
// expires.
const maxHeartbeatAge = time.Duration(1 << 62)

// heartbeatMono places heartbeat hb, read at wall time now and monotonic
// time mono, on the engine's monotonic clock: mono less its age, which is
// neither negative (a heartbeat in the future counts as now) nor beyond
// maxHeartbeatAge (docs/PROTOCOL.md §5: expiry is measured on the
// monotonic clock).
func heartbeatMono(hb, now time.Time, mono time.Duration) time.Duration {
	return mono - min(max(now.Sub(hb), 0), maxHeartbeatAge)
}

// Add indexes loaded records, replacing any of the same lease id: their
// expiry is filled in, their heartbeats placed on the monotonic clock by
// their age at wall time now and monotonic time mono (the Clock's), and
// the generation mark raised past theirs. Active leases are indexed as
// live by [Seam.Start]. The records become the engine's.
func (h Seam) Add(now time.Time, mono time.Duration, rs ...*Record) {
	s := h.e
	if len(s.leases) == 0 && len(rs) > 1 {
		s.leases = make(map[string]*Record, len(rs))
	}
	for _, r := range rs {
		s.fillExpiry(&r.Lease)
		r.hbMono = heartbeatMono(r.Lease.HeartbeatAt, now, mono)
		s.leases[r.Lease.ID] = r
		s.highGeneration = max(s.highGeneration, r.Lease.Generation)
	}
}

// Stamp returns the persister's stamp of the record of lease id, zero when
// there is none or no such record.
func (h Seam) Stamp(id string) Stamp {
	if r := h.e.leases[id]; r != nil {
		return r.Stamp
	}
	return Stamp{}
}

// SetStamp sets the persister's stamp of the record of lease id, and
// reports whether the engine holds that record (a reservation's record is
// written before the engine indexes it: its stamp is then not kept).
func (h Seam) SetStamp(id string, st Stamp) bool {
	r := h.e.leases[id]
	if r == nil {
		return false
	}
	r.Stamp = st
	return true
}

// Remove drops the record of lease id, which the medium no longer holds
// (a prune replayed from the journal), before [Seam.Start].
func (h Seam) Remove(id string) { delete(h.e.leases, id) }

// SetNamespaces sets the namespaces loaded from the medium, by path.
func (h Seam) SetNamespaces(nss map[string]leasecore.Namespace) { h.e.namespaces = nss }

// SetServed sets, for a read-only engine, the blocked flock waiters per
// resource of the daemon serving the medium, which its leases' Waiters
// count (docs/PROTOCOL.md §8).
func (h Seam) SetServed(counts map[string]int) { h.e.served = counts }

// StartReaper starts the reaper goroutine, which ends dead leases every
// Options.ReapInterval and prunes history until [Engine.Close].
func (h Seam) StartReaper() { h.e.startReaper() }

// Start indexes the active leases of the loaded records. Two active
// records for one resource cannot both be live: the newer (by generation,
// then start, then id) wins, whatever the order of loading. A read-only
// engine shows a previous daemon's handle lease of this host that a
// process still holds (Options.HandleHolders) as such. A writable one then
// settles, in generation order so that the outcome is deterministic: it
// ends the superseded records, ends its host's previous handle leases but
// those whose open file a process still holds (docs/PROTOCOL.md §2), and
// gives a generation to the active records of the reference store.
// Errors: the persister's, writing a settled record.
func (h Seam) Start() error {
	s := h.e
	order := func(a, b *Record) int {
		return cmp.Or(cmp.Compare(a.Lease.Generation, b.Lease.Generation),
			a.Lease.StartedAt.Compare(b.Lease.StartedAt), strings.Compare(a.Lease.ID, b.Lease.ID))
	}
	var settle []*Record // active records a writable engine must end or rewrite
	if len(s.live) == 0 {
		// Most loaded records are live ones: size the index once rather
		// than growing it through every doubling.
		s.live = make(map[string]*Record, len(s.leases))
	}
	for _, e := range s.leases {
		if e.Lease.Status != leasecore.StatusActive {
			continue
		}
		if prev := s.live[e.Lease.Resource]; prev != nil {
			if order(prev, e) > 0 {
				settle = append(settle, e)
				continue
			}
			s.dropLive(prev)
			settle = append(settle, prev)
		}
		s.addLive(e)
		if s.opts.ReadOnly && e.Lease.Mode == leasecore.ModeHandle && e.Lease.Host == s.opts.Host && s.opts.HandleHolders != nil {
			// A reader shows a handle lease of a previous daemon that a
			// process still holds as such (docs/PROTOCOL.md §2).
			if pids := s.opts.HandleHolders(e.Lease); len(pids) > 0 {
				e.Lease.Daemon, e.Lease.HolderPIDs = leasecore.DaemonPrevious, leasecore.FormatPIDs(pids)
			}
		}
		if e.Lease.Mode == leasecore.ModeHandle && e.Lease.Host == s.opts.Host || e.Lease.Generation == 0 {
			settle = append(settle, e)
		}
	}
	if s.opts.ReadOnly {
		return nil
	}
	slices.SortFunc(settle, order)
	settle = slices.Compact(settle)
	s.settling = true
	defer func() { s.settling = false }()
	for _, e := range settle {
		switch {
		case s.live[e.Lease.Resource] != e:
			if err := s.endLocked(e, e.Lease, leasecore.StatusAbandoned, leasecore.ChangeExpired, "superseded by a newer active record", true); err != nil {
				return err
			}
		case e.Lease.Mode == leasecore.ModeHandle && e.Lease.Host == s.opts.Host:
			// A daemon ends only its own previous handle leases, and only
			// those whose open file no process holds any more
			// (docs/PROTOCOL.md §2).
			if s.opts.HandleHolders != nil {
				if pids := s.opts.HandleHolders(e.Lease); len(pids) > 0 {
					e.Lease.Daemon, e.Lease.HolderPIDs = leasecore.DaemonPrevious, leasecore.FormatPIDs(pids)
					s.opts.Logger.Info("handle lease kept", "resource", e.Lease.Resource, "lease", e.Lease.ID,
						"generation", e.Lease.Generation, "holder_pids", e.Lease.HolderPIDs,
						"reason", "a process still holds the open file it was locked on")
					continue
				}
			}
			if err := s.endLocked(e, e.Lease, leasecore.StatusAbandoned, leasecore.ChangeExpired, "handle lease of a previous daemon", true); err != nil {
				return err
			}
		case e.Lease.Generation == 0:
			// A record of the reference store: give it a generation so it
			// has a fencing number and an inode of its own.
			l := e.Lease
			l.Generation = s.highGeneration + 1
			if err := s.persist.WriteRecord(&l, e.Hash); err != nil {
				return err
			}
			s.highGeneration = l.Generation
			e.Lease = l
		}
	}
	return nil
}
