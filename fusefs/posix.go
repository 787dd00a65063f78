package fusefs

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// posixKey identifies an fcntl lock owner (a process's file table) on one
// FUSE node.
type posixKey struct {
	node  uint64
	owner uint64
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

// lockRequests maps the lock requests in flight to their FUSE node ids,
// which go-fuse's fs API does not pass to the lock methods; see rawFS.
// Safe for concurrent use.
type lockRequests struct{ m sync.Map } // <-chan struct{} (cancel) → uint64

// node returns the FUSE node id of the lock request in ctx.
func (r *lockRequests) node(ctx context.Context) (uint64, bool) {
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

// during records nodeID for request cancel while call runs.
func (r *lockRequests) during(cancel <-chan struct{}, nodeID uint64, call func() fuse.Status) fuse.Status {
	r.m.Store(cancel, nodeID)
	defer r.m.Delete(cancel)
	return call()
}
