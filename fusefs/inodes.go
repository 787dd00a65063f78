package fusefs

import (
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// Inode number ranges: namespaces count up from firstDirIno; a lease's
// inode is leaseInoBase plus its generation, so it is never reused.
const (
	firstDirIno  = 2
	leaseInoBase = 1 << 40
)

// leaseIno is the inode number of lease l: fixed for the lease, never
// reused, since generations strictly increase (docs/PROTOCOL.md §1, §3).
func leaseIno(l leasecore.Lease) uint64 { return leaseInoBase + l.Generation }

// dirInodes allocates the inode numbers of namespaces: one per namespace
// path while it exists, a new one when a removed namespace is made again.
// Safe for concurrent use; its lock is a leaf.
type dirInodes struct {
	mu   sync.Mutex
	inos map[string]uint64 // namespace path → inode number
	next uint64
}

// ino returns the inode number of namespace path, allocating one; the root
// ("") is FUSE_ROOT_ID.
func (d *dirInodes) ino(path string) uint64 {
	if path == "" {
		return fuse.FUSE_ROOT_ID
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inos == nil {
		d.inos, d.next = make(map[string]uint64), firstDirIno
	}
	ino, ok := d.inos[path]
	if !ok {
		ino = d.next
		d.next++
		d.inos[path] = ino
	}
	return ino
}

// drop forgets a removed namespace's inode number.
func (d *dirInodes) drop(path string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.inos, path)
}
