package fusefs

import (
	"context"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// nobody is the uid and gid assumed when a request carries no caller.
const nobody = 65534

// caller is the identity of the process behind a FUSE request.
type caller struct {
	uid, gid uint32
	pid      int // process (thread group) id, 0 when unknown
	tid      int // the calling thread, 0 when unknown
}

// callerOf returns the caller of the request in ctx. FUSE reports the
// calling thread; it is mapped to its process (docs/ARCHITECTURE.md,
// kernel facts). Pids identify for audit and liveness, never authorise.
func callerOf(ctx context.Context) caller {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		// Never happens under go-fuse; fail closed as an unprivileged uid.
		return caller{uid: nobody, gid: nobody}
	}
	return caller{uid: c.Uid, gid: c.Gid, pid: leasecore.ProcessTgid(int(c.Pid)), tid: int(c.Pid)}
}

// mayHold reports whether c may act as the holder of l: the holder uid or
// root (docs/PROTOCOL.md §7).
func (c caller) mayHold(l leasecore.Lease) bool { return c.uid == 0 || c.uid == l.HolderUID }
