package engine

import "github.com/leasefs/leasefs/leasecore"

// MemStore is a [leasecore.Store] that keeps its leases in memory only: the
// lease engine of the file store without the disk. Everything it grants is
// lost when it is closed; changes are "durable" at once. It serves tests of
// code above the store (fusefs) and is the reference the contract suite
// checks the file store against. Safe for concurrent use.
type MemStore struct {
	*Engine
}

var _ leasecore.Store = (*MemStore)(nil)

// NewMemStore returns an empty in-memory store; opts.ReadOnly is ignored.
// Its reaper runs until [MemStore.Close].
func NewMemStore(opts leasecore.Options) *MemStore {
	opts.ReadOnly = false
	e, seam := New(Options{Options: opts.WithDefaults()}, memDisk{})
	seam.StartReaper()
	return &MemStore{Engine: e}
}

// memDisk is the [Persister] of [MemStore]: nothing to write.
type memDisk struct{}

func (memDisk) WriteRecord(*leasecore.Lease, string) error          { return nil }
func (memDisk) RemoveRecords([]string) error                        { return nil }
func (memDisk) SaveGeneration(uint64) error                         { return nil }
func (memDisk) SaveNamespaces(map[string]leasecore.Namespace) error { return nil }
func (memDisk) PublishWaiters(map[string]int)                       {}
func (memDisk) Close()                                              {}
func (memDisk) Await() (bool, error)                                { return false, nil }
