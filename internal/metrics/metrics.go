package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/refusal"
	"github.com/leasefs/leasefs/leasecore"
)

// Reasons of leasefs_leases_ended_total.
const (
	reasonReleased = "released"
	reasonExpired  = "expired"
)

// lockWaitBuckets are the upper bounds, in seconds, of the buckets of
// leasefs_lock_wait_seconds: from a handoff that took a millisecond to a
// wait behind an hour-long job.
var lockWaitBuckets = []float64{0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600}

// commitBuckets are the upper bounds, in seconds, of the buckets of
// leasefs_store_commit_duration_seconds: from a write and fsync on a fast
// SSD to a stalled disk.
var commitBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// ErrFollowing is returned by [Registry.Follow] when the registry already
// follows a store.
var ErrFollowing = errors.New("metrics: already following a store")

// Options configure [New]. The zero value works.
type Options struct {
	// Logger receives the errors of collecting metrics for a scrape;
	// default slog.Default().
	Logger *slog.Logger
}

// Registry holds the metrics of one daemon (see the package
// documentation) in a Prometheus registry of its own. Create it with
// [New], pass its hook methods to the store and the filesystem, call
// [Registry.Follow] once the store is open, and serve [Registry.Handler].
// Safe for concurrent use.
type Registry struct {
	reg *prometheus.Registry
	log *slog.Logger

	reserved  prometheus.Counter
	renewed   prometheus.Counter
	released  prometheus.Counter
	expired   prometheus.Counter
	refusals  *prometheus.CounterVec
	conflicts *prometheus.CounterVec
	lockWait  prometheus.Histogram
	commit    prometheus.Histogram

	following atomic.Bool
}

// New returns a registry with every metric but the store gauges, which
// [Registry.Follow] adds; the counters start at zero.
func New(opts Options) *Registry {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ended := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasefs_leases_ended_total",
		Help: `Leases ended, by reason: "released" by the holder or on its behalf (unlink, unlock, close, handover), "expired" by a liveness rule.`,
	}, []string{"reason"})
	r := &Registry{
		reg: prometheus.NewRegistry(),
		log: opts.Logger,
		reserved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasefs_leases_reserved_total",
			Help: "Leases granted (token leases by create, handle leases by lock).",
		}),
		renewed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasefs_lease_renewals_total",
			Help: "Heartbeats of token leases (token or command writes).",
		}),
		released: ended.WithLabelValues(reasonReleased),
		expired:  ended.WithLabelValues(reasonExpired),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasefs_refusals_total",
			Help: "Operations refused by the daemon for misuse or a failure of the store, by operation and errno; conflicts are leasefs_conflicts_total.",
		}, []string{"op", "errno"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasefs_conflicts_total",
			Help: "Operations that found the name held (EAGAIN of a try-lock or during a handover, EEXIST of an O_EXCL create or mkdir, EINTR of an interrupted wait), by operation and errno.",
		}, []string{"op", "errno"}),
		lockWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasefs_lock_wait_seconds",
			Help:    "How long a blocking lock (flock, F_SETLKW) waited before it was granted a lease.",
			Buckets: lockWaitBuckets,
		}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasefs_store_commit_duration_seconds",
			Help:    "How long a store call that changed something took to make it durable: on the file store the wait for its journal commit, on the etcd store the round trip of its transaction.",
			Buckets: commitBuckets,
		}),
	}
	r.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		r.reserved, r.renewed, ended, r.refusals, r.conflicts, r.lockWait, r.commit,
	)
	return r
}

// Handler returns the HTTP handler that serves the metrics in the
// Prometheus exposition format. A metric that cannot be collected (the
// store is closed) is logged and left out; the others are still served.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{
		ErrorLog:      errorLog{r.log},
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// Follow adds the gauges read from store at each scrape and counts the
// lease events of its change feed, from now until ctx is done or the store
// closes, on a goroutine of its own. Events before the call are not seen:
// leases already live are not counted as reserved. Errors: [ErrFollowing]
// when called a second time.
func (r *Registry) Follow(ctx context.Context, store leasecore.Store) error {
	if !r.following.CompareAndSwap(false, true) {
		return ErrFollowing
	}
	events := store.Watch(ctx)
	r.reg.MustRegister(newStoreCollector(store))
	go r.follow(events)
	return nil
}

// follow counts the events of a change feed until it is closed.
func (r *Registry) follow(events <-chan leasecore.Event) {
	for ev := range events {
		switch ev.Change {
		case leasecore.ChangeReserved:
			r.reserved.Inc()
		case leasecore.ChangeRenewed:
			r.renewed.Inc()
		case leasecore.ChangeReleased:
			r.released.Inc()
		case leasecore.ChangeExpired:
			r.expired.Inc()
		}
	}
}

// Refused counts one refusal of op with errno, labelled by errno's
// symbolic name ("EACCES"): in leasefs_conflicts_total when it is a
// conflict ([refusal.Classify]), else in leasefs_refusals_total. It has
// the signature of fusefs.Options.OnRefuse.
func (r *Registry) Refused(op string, errno syscall.Errno) {
	c := r.refusals
	if refusal.Classify(errno) == refusal.Conflict {
		c = r.conflicts
	}
	c.WithLabelValues(op, errnoName(errno)).Inc()
}

// LockGranted records how long a blocking lock waited before it was
// granted (wait, observed in seconds). It has the signature of
// fusefs.Options.OnHandoff.
func (r *Registry) LockGranted(wait time.Duration) {
	r.lockWait.Observe(wait.Seconds())
}

// Committed records how long one durable change of the store took (d,
// observed in seconds). It has the signature of leasecore.Options.OnCommit.
func (r *Registry) Committed(d time.Duration) {
	r.commit.Observe(d.Seconds())
}

// errnoName renders errno as its symbolic name, e.g. "EACCES"; EWOULDBLOCK
// is EAGAIN on Linux.
func errnoName(e syscall.Errno) string {
	if name := unix.ErrnoName(e); name != "" {
		return name
	}
	return fmt.Sprintf("errno %d", int(e))
}

// errorLog passes the errors of the HTTP handler to a logger.
type errorLog struct{ log *slog.Logger }

// Println logs v at WARN.
func (l errorLog) Println(v ...any) {
	l.log.Warn("collecting metrics failed", "err", fmt.Sprint(v...))
}
