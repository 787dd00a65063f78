package fusefs

import (
	"sync"

	"github.com/leasefs/leasefs/leasecore"
)

// maxDocSizes bounds the [docSizes] cache; past it the cache starts over.
const maxDocSizes = 4096

// docSizes caches the length of the status document of each lease, which
// is a lease file's st_size (docs/PROTOCOL.md §3, stat): every GETATTR,
// LOOKUP and CREATE reports it, and rendering the document for its length
// costs more than the rest of the reply. An entry is keyed by the lease id
// and holds the whole lease value it was computed from; it is used only
// for an equal value, so a renewal, a new waiter or any other change of a
// field misses and recomputes: the size is always that of the document a
// read would return at that moment. Entries of ended leases are forgotten
// by [FS.Run].
//
// Safe for concurrent use; its lock is a leaf.
type docSizes struct {
	mu    sync.Mutex
	sizes map[string]docSize
}

// docSize is the status document length n of lease value l.
type docSize struct {
	l leasecore.Lease
	n uint64
}

// size returns len(leasecore.StatusDocument(l)).
func (d *docSizes) size(l leasecore.Lease) uint64 {
	d.mu.Lock()
	e, ok := d.sizes[l.ID]
	d.mu.Unlock()
	if ok && e.l == l {
		return e.n
	}
	n := uint64(len(leasecore.StatusDocument(l)))
	d.mu.Lock()
	if d.sizes == nil || len(d.sizes) >= maxDocSizes {
		d.sizes = make(map[string]docSize)
	}
	d.sizes[l.ID] = docSize{l: l, n: n}
	d.mu.Unlock()
	return n
}

// forget drops the entry of lease id.
func (d *docSizes) forget(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.sizes, id)
}
