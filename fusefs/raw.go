package fusefs

import (
	"github.com/hanwen/go-fuse/v2/fuse"
)

// rawFS wraps the node tree's protocol server to see what go-fuse's fs API
// hides (docs/ARCHITECTURE.md, kernel facts): the FUSE node id of an fcntl lock request, and the
// lock owner of FLUSH. POSIX locks belong to a process and a file; the
// kernel sends no unlock when the process closes the file, only FLUSH with
// the lock owner, so an fcntl handle lease ends on the owner's FLUSH of that
// node (POSIX.1 fcntl: closing any descriptor of a file releases the
// process's locks on it).
type rawFS struct {
	fuse.RawFileSystem
	fsys *FS
}

var _ fuse.RawFileSystem = (*rawFS)(nil)

// withNode records the node id of a lock request for the duration of the
// call, keyed by the request's cancel channel, which is unique among
// requests in flight.
func (r *rawFS) withNode(cancel <-chan struct{}, nodeID uint64, call func() fuse.Status) fuse.Status {
	return r.fsys.requests.during(cancel, nodeID, call)
}

// GetLk passes the request on with its node id recorded.
func (r *rawFS) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	return r.withNode(cancel, in.NodeId, func() fuse.Status { return r.RawFileSystem.GetLk(cancel, in, out) })
}

// SetLk passes the request on with its node id recorded.
func (r *rawFS) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return r.withNode(cancel, in.NodeId, func() fuse.Status { return r.RawFileSystem.SetLk(cancel, in) })
}

// SetLkw passes the request on with its node id recorded.
func (r *rawFS) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return r.withNode(cancel, in.NodeId, func() fuse.Status { return r.RawFileSystem.SetLkw(cancel, in) })
}

// Flush ends the fcntl handle lease of the flushing lock owner on this node,
// then passes the request on. A FLUSH never ends a flock handle lease.
func (r *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	r.fsys.posixClose(posixKey{node: in.NodeId, owner: in.LockOwner})
	return r.RawFileSystem.Flush(cancel, in)
}
