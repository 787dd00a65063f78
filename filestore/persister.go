package filestore

import "github.com/leasefs/leasefs/leasecore"

// persister is the [engine.Persister] of a [Store]: the journal, the
// record files and the state files (docs/PROTOCOL.md §4.3). It is a type
// of its own so that its methods are not methods of Store. Its methods
// but Await are called with the engine's lock held.
type persister struct{ s *Store }

// WriteRecord journals the record of l and replaces its file; see
// Store.writeRecord.
func (p persister) WriteRecord(l *leasecore.Lease, tokenHash string) error {
	return p.s.writeRecord(l, tokenHash)
}

// RemoveRecords removes the records of pruned leases; see
// Store.removeRecords.
func (p persister) RemoveRecords(ids []string) error { return p.s.removeRecords(ids) }

// SaveGeneration journals the generation high-water mark g; see
// Store.saveGeneration.
func (p persister) SaveGeneration(g uint64) error { return p.s.saveGeneration(g) }

// SaveNamespaces writes namespaces.toml; see Store.saveNamespaces.
func (p persister) SaveNamespaces(nss map[string]leasecore.Namespace) error {
	return p.s.saveNamespaces(nss)
}

// Await waits for the journal commit of every change so far; see
// Store.await.
func (p persister) Await() (bool, error) { return p.s.await() }

// PublishWaiters hands the waiter counts to the waiters writer; see
// Store.publishWaiters.
func (p persister) PublishWaiters(counts map[string]int) { p.s.publishWaiters(counts) }

// Close checkpoints and releases the store's files; see Store.close.
func (p persister) Close() { p.s.close() }
