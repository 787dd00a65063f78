// Package metrics is the Prometheus instrumentation of a leasefs daemon
// (docs/PROTOCOL.md §8b): a registry of its own, never the global one, with
// the lease, refusal, lock and store metrics below, the Go runtime and
// process collectors, and the HTTP handler that serves them in the
// Prometheus text format.
//
// # Metrics
//
//   - leasefs_live_leases{mode="token"|"handle"} (gauge): live leases, read
//     from the store at each scrape.
//   - leasefs_lock_waiters (gauge): blocked lock waits (flock, F_SETLKW) on
//     held names, read from the store at each scrape.
//   - leasefs_leases_reserved_total (counter): leases granted.
//   - leasefs_lease_renewals_total (counter): heartbeats of token leases.
//   - leasefs_leases_ended_total{reason="released"|"expired"} (counter):
//     leases ended by their holder (or on its behalf: an unlink, a lock
//     released, an open file closed, a handover) or by a liveness rule.
//   - leasefs_refusals_total{op,errno} (counter): operations refused for
//     misuse or a failure of the store, by the operation as the daemon's
//     "refused" log line names it and the errno the caller got.
//   - leasefs_conflicts_total{op,errno} (counter): operations that found
//     the name held, the expected outcome of contention
//     (internal/refusal.Conflict: EAGAIN, EEXIST, EINTR), by operation and
//     errno; the daemon logs them at DEBUG only.
//   - leasefs_lock_wait_seconds (histogram): how long a blocking lock waited
//     before it was granted a lease.
//   - leasefs_store_commit_duration_seconds (histogram): how long a durable
//     change of the store took.
//   - leasefs_store_reachable (gauge) and
//     leasefs_store_unreachable_calls_total (counter): for a store that
//     reports its connection (leasecore.HealthReporter: the etcd store),
//     whether its cluster answered the last call and how many calls failed
//     because it did not, read at scrape time.
//   - leasefs_store_lagging_records (gauge): for a store that writes record
//     files behind its journal (leasecore.BacklogReporter: the file store),
//     how many records are durable in the journal only, read at scrape time.
//   - go_* and process_*: the Go runtime and process collectors.
//
// # Feeding it
//
// Neither leasecore nor fusefs imports Prometheus. The lease counters come
// from the store's change feed ([Registry.Follow]); the gauges from
// [leasecore.Store.List], [leasecore.HealthReporter] and
// [leasecore.BacklogReporter] at scrape time; refusals and conflicts, lock waits and store
// commits from plain hook functions: [Registry.Refused] for
// fusefs.Options.OnRefuse, [Registry.LockGranted] for
// fusefs.Options.OnHandoff, [Registry.Committed] for
// leasecore.Options.OnCommit.
package metrics
