package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasefs/leasefs/leasecore"
)

// storeCollector reads the live leases of a store at each scrape:
// leasefs_live_leases by mode, leasefs_lock_waiters and
// leasefs_previous_daemon_handle_leases; for a store that
// reports its connection ([leasecore.HealthReporter], the etcd store) also
// leasefs_store_reachable, leasefs_store_unreachable_calls_total,
// leasefs_handle_leases_in_jeopardy, leasefs_handle_lease_jeopardy_total
// and leasefs_handle_lease_jeopardy_saved_total; for a
// store that writes record files behind its journal
// ([leasecore.BacklogReporter], the file store) also
// leasefs_store_lagging_records. Safe for concurrent use.
type storeCollector struct {
	store       leasecore.Store
	live        *prometheus.Desc
	waiters     *prometheus.Desc
	reachable   *prometheus.Desc
	unreachable *prometheus.Desc
	lagging     *prometheus.Desc
	previous    *prometheus.Desc
	jeopardy    *prometheus.Desc
	jeopTotal   *prometheus.Desc
	jeopSaved   *prometheus.Desc
}

var _ prometheus.Collector = storeCollector{}

func newStoreCollector(store leasecore.Store) storeCollector {
	return storeCollector{
		store: store,
		live: prometheus.NewDesc("leasefs_live_leases",
			"Live leases, by mode (token or handle).", []string{"mode"}, nil),
		waiters: prometheus.NewDesc("leasefs_lock_waiters",
			"Blocking lock requests (flock, F_SETLKW) waiting for a held name.", nil, nil),
		reachable: prometheus.NewDesc("leasefs_store_reachable",
			"1 while the store's remote service (the etcd cluster) answered its last call, else 0.", nil, nil),
		unreachable: prometheus.NewDesc("leasefs_store_unreachable_calls_total",
			"Store calls that failed because the remote service (the etcd cluster) did not answer.", nil, nil),
		jeopardy: prometheus.NewDesc("leasefs_handle_leases_in_jeopardy",
			"Handle leases held through this daemon past their local deadline without a confirmed keep-alive, within the grace period (docs/PROTOCOL.md §8a).", nil, nil),
		jeopTotal: prometheus.NewDesc("leasefs_handle_lease_jeopardy_total",
			"Handle leases that entered jeopardy (docs/PROTOCOL.md §8a).", nil, nil),
		jeopSaved: prometheus.NewDesc("leasefs_handle_lease_jeopardy_saved_total",
			"Handle leases that left jeopardy kept alive, not ended (docs/PROTOCOL.md §8a).", nil, nil),
		previous: prometheus.NewDesc("leasefs_previous_daemon_handle_leases",
			"Live handle leases locked through a previous daemon's mount whose open file a process still holds (docs/PROTOCOL.md §2).", nil, nil),
		lagging: prometheus.NewDesc("leasefs_store_lagging_records",
			"Records whose change is durable in the journal and not yet written to the record file (0 within 100 ms of the last change while the disk accepts writes).", nil, nil),
	}
}

// Describe sends the descriptors of the metrics Collect sends.
func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.live
	ch <- c.waiters
	ch <- c.previous
	if _, ok := c.store.(leasecore.HealthReporter); ok {
		ch <- c.reachable
		ch <- c.unreachable
		ch <- c.jeopardy
		ch <- c.jeopTotal
		ch <- c.jeopSaved
	}
	if _, ok := c.store.(leasecore.BacklogReporter); ok {
		ch <- c.lagging
	}
}

// Collect lists the store's live leases and sends both gauges; when the
// store cannot be read (it is closed), it sends an invalid metric carrying
// the error instead.
func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	if hr, ok := c.store.(leasecore.HealthReporter); ok {
		h := hr.Health()
		up := 0.0
		if h.Reachable {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.reachable, prometheus.GaugeValue, up)
		ch <- prometheus.MustNewConstMetric(c.unreachable, prometheus.CounterValue, float64(h.Failures))
		ch <- prometheus.MustNewConstMetric(c.jeopardy, prometheus.GaugeValue, float64(h.InJeopardy))
		ch <- prometheus.MustNewConstMetric(c.jeopTotal, prometheus.CounterValue, float64(h.JeopardyTotal))
		ch <- prometheus.MustNewConstMetric(c.jeopSaved, prometheus.CounterValue, float64(h.JeopardySaved))
	}
	if br, ok := c.store.(leasecore.BacklogReporter); ok {
		ch <- prometheus.MustNewConstMetric(c.lagging, prometheus.GaugeValue, float64(br.LaggingRecords()))
	}
	leases, err := c.store.List(context.Background())
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.live, err)
		return
	}
	var token, handle, waiters, previous int
	for _, l := range leases {
		if l.Daemon == leasecore.DaemonPrevious {
			previous++
		}
		switch l.Mode {
		case leasecore.ModeToken:
			token++
		case leasecore.ModeHandle:
			handle++
		}
		waiters += l.Waiters
	}
	ch <- prometheus.MustNewConstMetric(c.live, prometheus.GaugeValue, float64(token), string(leasecore.ModeToken))
	ch <- prometheus.MustNewConstMetric(c.live, prometheus.GaugeValue, float64(handle), string(leasecore.ModeHandle))
	ch <- prometheus.MustNewConstMetric(c.waiters, prometheus.GaugeValue, float64(waiters))
	ch <- prometheus.MustNewConstMetric(c.previous, prometheus.GaugeValue, float64(previous))
}
