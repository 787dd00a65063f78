package leasecore

import (
	"log/slog"
	"time"

	"github.com/leasefs/leasefs/internal/procfs"
)

// Options are the options every store takes (the file store, the memory
// store, the etcd store); a store's own options embed them. The zero value
// works: every zero field takes its documented default ([Options.WithDefaults]).
type Options struct {
	// LeaseDuration is the heartbeat TTL of token leases (docs/PROTOCOL.md
	// §5); default [DefaultLeaseDuration], or for a ReadOnly file store the
	// duration the directory was last served with.
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
	// ReadOnly opens the store for reading: nothing is written, no reaper
	// runs, and mutating methods return ErrReadOnly. Used by "leasefs ls"
	// and "history" (docs/PROTOCOL.md §8). The memory store ignores it.
	ReadOnly bool
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

// WithDefaults returns o with every zero field set to its documented
// default: the one place the defaults are computed, for every store.
func (o Options) WithDefaults() Options {
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
