package fusefs

import (
	"github.com/hanwen/go-fuse/v2/fuse"
)

// rawFS wraps the node tree's protocol server to see what go-fuse's fs API
// hides (docs/ARCHITECTURE.md, kernel facts): the lock owner of FLUSH. POSIX
// locks belong to a process and a file; the kernel sends no unlock when the
// process closes the file, only FLUSH with the lock owner, so an fcntl
// handle lease ends on the owner's FLUSH of a descriptor of that name
// (POSIX.1 fcntl: closing any descriptor of a file releases the process's
// locks on it).
type rawFS struct {
	fuse.RawFileSystem
	fsys *FS
}

var _ fuse.RawFileSystem = (*rawFS)(nil)

// Flush passes the request on with its lock owner recorded, for
// [leaseHandle.Flush]. The request's cancel channel is replaced by one of
// its own that never closes: it keys the record, and a FLUSH is not cut
// short by an interrupt (see interrupt.go).
func (r *rawFS) Flush(_ <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	key := make(chan struct{})
	return r.fsys.flushes.during(key, in.LockOwner, func() fuse.Status { return r.RawFileSystem.Flush(key, in) })
}
