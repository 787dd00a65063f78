package leasecore

// MemStore is a [Store] that keeps its leases in memory only: the lease
// engine of [FileStore] without the disk. Everything it grants is lost when
// it is closed; changes are "durable" at once. It serves tests of code
// above the store (fusefs) and is the reference the contract suite checks
// the file store against. Safe for concurrent use.
type MemStore struct {
	*store
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns an empty in-memory store; opts.ReadOnly and
// opts.NoDaemon are ignored. Its reaper runs until [MemStore.Close].
func NewMemStore(opts Options) *MemStore {
	opts.ReadOnly, opts.NoDaemon = false, false
	s := &MemStore{store: newStore(opts.withDefaults(), memDisk{})}
	s.startReaper()
	return s
}

// memDisk is the persister of [MemStore]: nothing to write.
type memDisk struct{}

func (memDisk) writeRecord(*Lease, string) (recordStamp, error) { return recordStamp{}, nil }
func (memDisk) removeRecords([]string) error                    { return nil }
func (memDisk) saveGeneration(uint64) error                     { return nil }
func (memDisk) saveNamespaces(map[string]Namespace) error       { return nil }
func (memDisk) publishWaiters(map[string]int)                   {}
func (memDisk) close()                                          {}
func (memDisk) await() (bool, error)                            { return false, nil }
