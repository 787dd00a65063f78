// Package leasecore is the lease store of leasefs: exclusive writer leases on
// named resources, kept as durable TOML records, with bearer tokens stored only
// as blake3 hashes, heartbeat expiry, pid and boot liveness, and fencing
// generations.
//
// # Model
//
// A resource (a slash-separated path such as "feature/a") has at most one live
// lease at a time (docs/PROTOCOL.md §1). A lease is granted by [Store.Reserve], which
// returns its bearer token exactly once; the token renews the lease
// ([Store.Renew]) and releases it ([Store.Release]). A token lease dies when its
// heartbeat is older than the lease duration, when a recorded holder process is
// gone, or when the machine has rebooted since it was granted (docs/PROTOCOL.md §5). Reads
// are pure: a dead lease is shown ended at once, and the store's own reaper
// ends it as [StatusAbandoned] and publishes the end on the change feed
// ([Store.Watch]), through which the mount learns of every end it did not
// cause. Blocked [Store.Acquire] calls wait first come first served in the
// store and are woken by the end itself.
//
// # Stores
//
// [FileStore] and [MemStore] share one lease engine; the file store adds the
// records on disk. Package storetest is the contract every [Store] passes.
//
// # Records
//
// The file store ([OpenFileStore]) keeps one record per lease in
// <state>/writer-leases/<lease-id>.toml with the field names of docs/PROTOCOL.md §4.3. Every
// change is appended to the journal (journal.0, journal.1) and is durable
// before the call returns: one fdatasync(2) covers every change that arrived
// while the previous one ran (group commit). The record files are written
// behind from the journal and synced by checkpoints; readers replay the
// journal, so they never see the lag (docs/PROTOCOL.md §4.3,
// docs/ARCHITECTURE.md "Group commit in the file store"). Record writes are
// serialised across processes by an exclusive flock(2) on
// <state>/writer-leases/.lock; readers such as "leasefs ls" take it shared.
// The daemon keeps an in-memory index so that reserving a name does not read
// every record.
//
// # Time
//
// Wall-clock times are recorded for people and for other processes; expiry
// inside a running store is measured on the monotonic clock of the injected
// [Clock], so wall-clock steps neither expire nor extend a lease (docs/PROTOCOL.md §5).
//
// # Single-daemon lock
//
// One daemon writes a state directory at a time. The lock that ensures it,
// on <state>/leasefs.lock, is not part of the store: it lives in package
// internal/daemonlock, taken by the mount before it opens the store.
package leasecore
