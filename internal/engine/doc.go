// Package engine is the in-memory lease engine of leasefs: the index of
// leases and namespaces, the liveness rules (docs/PROTOCOL.md §5), the
// first-come-first-served wait queues (§6), the change feed and the reaper.
// An [Engine] implements [leasecore.Store] over a [Persister], which makes
// its changes durable (the file store's journal and records); the store
// that owns the persister loads the engine and takes its lock through the
// [Seam] that [New] returns, and reaches nothing else. [MemStore] is the
// engine over no medium.
package engine
