package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasefs/leasefs/leasecore"
)

// storeCollector reads the live leases of a store at each scrape:
// leasefs_live_leases by mode and leasefs_lock_waiters. Safe for concurrent
// use.
type storeCollector struct {
	store   leasecore.Store
	live    *prometheus.Desc
	waiters *prometheus.Desc
}

var _ prometheus.Collector = storeCollector{}

func newStoreCollector(store leasecore.Store) storeCollector {
	return storeCollector{
		store: store,
		live: prometheus.NewDesc("leasefs_live_leases",
			"Live leases, by mode (token or handle).", []string{"mode"}, nil),
		waiters: prometheus.NewDesc("leasefs_lock_waiters",
			"Blocking lock requests (flock, F_SETLKW) waiting for a held name.", nil, nil),
	}
}

// Describe sends the descriptors of both gauges.
func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.live
	ch <- c.waiters
}

// Collect lists the store's live leases and sends both gauges; when the
// store cannot be read (it is closed), it sends an invalid metric carrying
// the error instead.
func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	leases, err := c.store.List(context.Background())
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.live, err)
		return
	}
	var token, handle, waiters int
	for _, l := range leases {
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
}
