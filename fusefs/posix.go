package fusefs

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// posixKey identifies an fcntl lock owner (a process's file table) on one
// name. POSIX locks belong to a process and a file, and the file is the
// name, not the FUSE node: an owner whose blocked lock was granted holds a
// new lease through the node of the one it waited for, while a later open
// of the name finds the new lease's node, and closing either descriptor
// releases its lock (POSIX.1 fcntl).
type posixKey struct {
	resource string
	owner    uint64
}

// posixOwners maps each fcntl lock owner that holds a handle lease to that
// lease (docs/PROTOCOL.md §6). Safe for concurrent use; its lock is a leaf.
type posixOwners struct {
	mu     sync.Mutex
	leases map[posixKey]string // owner on a node → lease id
}

// get returns the lease held by owner key.
func (p *posixOwners) get(key posixKey) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.leases[key]
	return id, ok
}

// set records that owner key holds lease id.
func (p *posixOwners) set(key posixKey, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.leases == nil {
		p.leases = make(map[posixKey]string)
	}
	p.leases[key] = id
}

// take forgets what owner key holds, and returns it; when id is not empty,
// only if it is lease id.
func (p *posixOwners) take(key posixKey, id string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	held, ok := p.leases[key]
	if !ok || id != "" && held != id {
		return "", false
	}
	delete(p.leases, key)
	return held, true
}

// flushOwners maps the FLUSH requests in flight to their lock owners,
// which go-fuse's fs API does not pass to [leaseHandle.Flush]; see rawFS.
// Safe for concurrent use.
type flushOwners struct{ m sync.Map } // <-chan struct{} (cancel) → uint64

// owner returns the lock owner of the FLUSH request in ctx.
func (r *flushOwners) owner(ctx context.Context) (uint64, bool) {
	fc, ok := ctx.(*fuse.Context)
	if !ok {
		return 0, false
	}
	v, ok := r.m.Load(fc.Cancel)
	if !ok {
		return 0, false
	}
	return v.(uint64), true
}

// during records owner for request cancel while call runs.
func (r *flushOwners) during(cancel <-chan struct{}, owner uint64, call func() fuse.Status) fuse.Status {
	r.m.Store(cancel, owner)
	defer r.m.Delete(cancel)
	return call()
}
