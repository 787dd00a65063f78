// Package leasecore is the lease model of leasefs and the contract of its
// stores: exclusive writer leases on named resources, recorded as TOML
// records, with bearer tokens stored only as blake3 hashes, heartbeat
// expiry, pid and boot liveness, and fencing generations.
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
// This package holds no store. Package filestore is the file store (the
// default), internal/engine the lease engine it shares with the memory
// store, package etcdstore the etcd store; each implements [Store] and its
// optional capabilities ([HealthReporter], [BacklogReporter],
// [HandleOwner], [NameReader], [KnownReader]), takes [Options] (defaults
// from [Options.WithDefaults]), applies the rules of rules.go and encodes
// records with [EncodeRecord] (docs/PROTOCOL.md §4.3). Package storetest is
// the contract every [Store] passes.
//
// # Records
//
// A record is one lease in the TOML form of docs/PROTOCOL.md §4.3, with
// the field names of the field table ([EncodeRecord], [DecodeRecord]);
// the status document shows the same fields ([StatusDocument], §4.1).
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
// on <state>/leasefs.lock, is not part of any store: it lives in package
// internal/daemonlock, taken by the mount before it opens the store.
package leasecore
