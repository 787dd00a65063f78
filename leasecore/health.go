package leasecore

import "time"

// Health is what a store that depends on a remote service (the etcd store,
// docs/PROTOCOL.md §8a) knows of its connection.
type Health struct {
	// Reachable is false from the first call that failed because the
	// service did not answer until the next call it answered.
	Reachable bool
	// Since is when Reachable last changed (zero: never since the store
	// opened).
	Since time.Time
	// Failures counts the calls that failed because the service did not
	// answer, since the store opened.
	Failures uint64
}

// HealthReporter is implemented by stores that have a [Health] to report;
// the file store has none (its disk failures are refusals of their own).
// Implementations are safe for concurrent use.
type HealthReporter interface {
	// Health returns the store's view of its connection now.
	Health() Health
}
