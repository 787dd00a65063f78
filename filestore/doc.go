// Package filestore is the file store of leasefs, the default
// [leasecore.Store]: the lease engine of internal/engine made durable in a
// state directory.
//
// # Records
//
// [Open] keeps one record per lease in
// <state>/writer-leases/<lease-id>.toml with the field names of
// docs/PROTOCOL.md §4.3. Every change is appended to the journal
// (journal.0, journal.1) and is durable before the call returns: one
// fdatasync(2) covers every change that arrived while the previous one ran
// (group commit). The record files are written behind from the journal and
// synced by checkpoints; readers replay the journal, so they never see the
// lag (docs/PROTOCOL.md §4.3, docs/ARCHITECTURE.md "Group commit in the file
// store"). Record writes are serialised across processes by an exclusive
// flock(2) on <state>/writer-leases/.lock; readers such as "leasefs ls" take
// it shared. The daemon keeps an in-memory index (the engine) so that
// reserving a name does not read every record.
//
// # Locks
//
// The engine's lock first, then [Store]'s recMu, then the flock, then a
// journal's and the spare pool's locks (docs/ARCHITECTURE.md "Locks and
// their order").
package filestore
