package fusefs

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// XattrPrefix prefixes the extended attributes that expose the status
// fields, e.g. "user.lease.status" (docs/PROTOCOL.md §3).
const XattrPrefix = "user.lease."

// leaseNode is the inode of one lease. It holds only the lease id: the
// state lives in the store. Once the lease ends the node answers ESTALE, and
// the kernel looks the name up again (docs/ARCHITECTURE.md, kernel facts).
type leaseNode struct {
	fs.Inode
	fsys     *FS
	id       string
	resource string
	// holderUID and holderGID are the lease's holder, for the attributes
	// of an ended lease that the store no longer keeps (see ended).
	holderUID, holderGID uint32

	mu sync.Mutex
	// handles are the open files of this inode, which a granted lock may
	// have re-bound to a newer lease of the name (docs/PROTOCOL.md §6).
	handles map[*leaseHandle]struct{}
}

var (
	_ = (fs.NodeGetattrer)((*leaseNode)(nil))
	_ = (fs.NodeSetattrer)((*leaseNode)(nil))
	_ = (fs.NodeOpener)((*leaseNode)(nil))
	_ = (fs.NodeGetxattrer)((*leaseNode)(nil))
	_ = (fs.NodeListxattrer)((*leaseNode)(nil))
	_ = (fs.NodeSetxattrer)((*leaseNode)(nil))
	_ = (fs.NodeRemovexattrer)((*leaseNode)(nil))
)

// live returns the node's lease if it is still live; ESTALE with the
// lease as it ended otherwise (see ended).
func (n *leaseNode) live(ctx context.Context) (leasecore.Lease, syscall.Errno) {
	l, err := n.fsys.store.Load(ctx, n.id)
	if errors.Is(err, leasecore.ErrNotFound) {
		return n.ended(), syscall.ESTALE
	}
	if err != nil {
		return l, toErrno(err)
	}
	if !l.Live() {
		return l, syscall.ESTALE
	}
	return l, 0
}

// current returns the lease this inode describes: its own while live;
// once that has ended, the live lease that one of its open files was
// re-bound to by a granted lock, so that fstat and fgetxattr on a granted
// waiter's descriptor work (the kernel sends them per inode, not per open
// file). ESTALE when neither exists.
func (n *leaseNode) current(ctx context.Context) (leasecore.Lease, syscall.Errno) {
	l, errno := n.live(ctx)
	if errno != syscall.ESTALE {
		return l, errno
	}
	n.mu.Lock()
	ids := make([]string, 0, len(n.handles))
	for h := range n.handles {
		ids = append(ids, h.leaseID())
	}
	n.mu.Unlock()
	for _, id := range ids {
		if id == n.id {
			continue
		}
		if rebound, err := n.fsys.store.Load(ctx, id); err == nil && rebound.Live() {
			return rebound, 0
		}
	}
	return l, syscall.ESTALE
}

// currentKept is [leaseNode.current] for fstat and fgetxattr: a call of
// the lease's holder waits while the lease is in jeopardy ([FS.awaitKept];
// EINTR when interrupted meanwhile).
func (n *leaseNode) currentKept(ctx context.Context, op string) (leasecore.Lease, syscall.Errno) {
	if !n.fsys.jeopardy {
		return n.current(ctx)
	}
	c := callerOf(ctx)
	for {
		l, errno := n.current(ctx)
		if errno != 0 {
			return l, errno
		}
		if waited, errno := n.fsys.awaitKept(ctx, op, c, l); !waited || errno != 0 {
			return l, errno
		}
	}
}

// ended returns what the node knows of its lease once the store no longer
// keeps it (history pruned, or an etcd store that forgot an ended lease):
// an ended lease of the node's holder, for the attributes of an unlinked
// file.
func (n *leaseNode) ended() leasecore.Lease {
	return leasecore.Lease{
		ID:        n.id,
		Resource:  n.resource,
		Status:    leasecore.StatusAbandoned,
		HolderUID: n.holderUID,
		HolderGID: n.holderGID,
	}
}

// Getattr returns the lease's attributes (docs/PROTOCOL.md §3 stat row).
// It never answers ESTALE: once the node's lease has ended it shows the
// live lease that one of its open files was re-bound to (see current),
// else, to a caller in an open system call, what that open will reach
// (see opening), else the lease as it ended with st_nlink 0, like an
// unlinked file, so that fstat and lseek(SEEK_END) right after an open
// succeed whatever ended meanwhile (Python's open(path, "a+")). st_ino
// stays the inode's.
func (n *leaseNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	// fh is no help: for fstat the kernel sends none and go-fuse passes
	// the inode's first open file, whichever process it belongs to.
	l, errno := n.currentKept(ctx, "getattr")
	gone := false
	if errno == syscall.ESTALE {
		errno, gone = n.opening(ctx, &l)
	}
	if errno == syscall.EIO {
		// The store failed (a commit, a cluster call); an ended lease's
		// ENOENT is an answer, not a refusal worth a line.
		return n.fsys.refuse("getattr", n.resource, callerOf(ctx), errno, "the store failed")
	}
	if errno != 0 {
		return errno
	}
	n.fsys.fillLeaseAttr(l, &out.Attr)
	if gone {
		out.Nlink = 0
	}
	out.Ino = n.StableAttr().Ino // a re-bound lease is seen through this inode
	return 0
}

// opening answers the GETATTR that the kernel sends, to check permissions,
// between its lookup of this node and an OPEN, once the node's lease has
// ended: the ended lease's owner would decide the permission check of an
// open that reaches another lease, or reserves the free name
// (docs/PROTOCOL.md §3). While the caller is in an open system call, l
// becomes what the open will reach (see [leaseNode.resolve]): the name's
// current live lease, or, for an open with O_CREAT of a free name, the
// ended lease as the caller's own reservation will look; a free name
// without O_CREAT answers ENOENT. Any other caller (fstat of a descriptor
// whose lease ended), or one whose call cannot be read, sees l as it
// ended: gone is then true (st_nlink 0).
func (n *leaseNode) opening(ctx context.Context, l *leasecore.Lease) (errno syscall.Errno, gone bool) {
	c := callerOf(ctx)
	creates, inOpen := callerCreates(c.tid)
	if !inOpen {
		return 0, true
	}
	live, err := n.fsys.store.Live(ctx, n.resource)
	switch {
	case err == nil:
		*l = live
	case !errors.Is(err, leasecore.ErrNotFound):
		return toErrno(err), false
	case !creates:
		return syscall.ENOENT, false
	default:
		l.HolderUID, l.HolderGID = c.uid, c.gid
	}
	return 0, false
}

// Setattr accepts truncation to zero (ftruncate, truncate) and time
// changes (touch) from the holder uid or root as no-ops; any other change,
// or any change by another uid, is refused with EPERM (docs/PROTOCOL.md
// §3). It judges the lease of the open file the change came through, if
// any, else the inode's current lease (see current); once that has ended,
// the lease as it ended, so that the call is a no-op rather than ESTALE,
// as Getattr answers.
func (n *leaseNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	c := callerOf(ctx)
	var l leasecore.Lease
	var errno syscall.Errno
	if h, ok := fh.(*leaseHandle); ok {
		l, errno = h.lease(ctx)
	} else {
		l, errno = n.current(ctx)
	}
	gone := errno == syscall.ESTALE
	if errno != 0 && !gone {
		return n.fsys.refuse("setattr", n.resource, c, errno, "the store failed")
	}
	if !c.mayHold(l) {
		return n.fsys.refuse("setattr", n.resource, c, syscall.EPERM, "not the holder uid")
	}
	if in.Valid&(fuse.FATTR_MODE|fuse.FATTR_UID|fuse.FATTR_GID) != 0 {
		return n.fsys.refuse("setattr", n.resource, c, syscall.EPERM, "chmod and chown are not supported on leases")
	}
	if size, ok := in.GetSize(); ok && size != 0 {
		return n.fsys.refuse("setattr", n.resource, c, syscall.EPERM, "only truncation to zero is accepted")
	}
	n.fsys.fillLeaseAttr(l, &out.Attr)
	if gone {
		out.Nlink = 0
	}
	out.Ino = n.StableAttr().Ino
	return 0
}

// Open opens the lease with direct I/O, binding the handle to the lease it
// was opened on. A path open never fails with ESTALE (docs/PROTOCOL.md §3):
// when the lease the kernel looked up has ended before the open reached the
// daemon, the open takes the name as it is now (see [leaseNode.resolve]).
// O_TRUNC (passed in the flags: the mount negotiates atomic O_TRUNC) is a
// no-op, as a truncate is. An open that fails ends what it reserved before
// it answers. Errors: EACCES when a non-holder opens for writing; ENOENT
// when the name has no live lease and the open does not create; those of a
// reservation.
func (n *leaseNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	c := callerOf(ctx)
	l, errno := n.live(ctx)
	reserved := false
	if errno == syscall.ESTALE {
		l, reserved, errno = n.resolve(ctx, c)
	}
	if errno != 0 {
		return nil, 0, n.fsys.refuse("open", n.resource, c, errno, "no live lease to open")
	}
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY && !c.mayHold(l) {
		if reserved {
			n.fsys.endUnclaimed(unclaimed{resource: n.resource, id: l.ID})
		}
		return nil, 0, n.fsys.refuse("open", n.resource, c, syscall.EACCES, "not the holder uid")
	}
	return n.newHandle(l, reserved), fuse.FOPEN_DIRECT_IO, 0
}

// resolve finds what an open of this node's name reaches now that the
// node's own lease has ended: the name's current live lease; or, when the
// name is free and the caller's open has O_CREAT, a new token lease
// reserved for the caller (reserved is then true); ENOENT when the name is
// free and the open does not create. FUSE strips O_CREAT from OPEN, so the
// caller's flags are read from its system call; when they cannot be read,
// ESTALE makes the kernel look the name up once more, and that lookup
// creates or fails with ENOENT itself.
func (n *leaseNode) resolve(ctx context.Context, c caller) (l leasecore.Lease, reserved bool, errno syscall.Errno) {
	// Each round ends when the name is held or reserved; another round is
	// needed only when someone else reserved between the two calls.
	for range maxResolveRounds {
		l, err := n.fsys.store.Live(ctx, n.resource)
		if err == nil {
			return l, false, 0
		}
		if !errors.Is(err, leasecore.ErrNotFound) {
			return l, false, toErrno(err)
		}
		creates, known := callerCreates(c.tid)
		switch {
		case !known:
			return l, false, syscall.ESTALE
		case !creates:
			return l, false, syscall.ENOENT
		}
		g, err := n.fsys.reserve(ctx, n.resource, c)
		if errors.Is(err, leasecore.ErrHeld) {
			continue // reserved by another since Live: open that lease
		}
		if err != nil {
			return l, false, toErrno(err)
		}
		return g.Lease, true, 0
	}
	return leasecore.Lease{}, false, syscall.ESTALE
}

// maxResolveRounds bounds the rounds of [leaseNode.resolve] on a name that
// is reserved and ended again and again between its calls.
const maxResolveRounds = 8

// xattrValue returns the value of attribute name of l.
func (f *FS) xattrValue(l leasecore.Lease, name string) (string, bool) {
	key, ok := strings.CutPrefix(name, XattrPrefix)
	if !ok {
		return "", false
	}
	for _, f := range leasecore.StatusFields(l) {
		if f.Key == key {
			return f.Raw, true
		}
	}
	return "", false
}

// Getxattr returns status field "user.lease.<field>" (docs/PROTOCOL.md §3). Errors:
// ENODATA for unknown names, ERANGE when dest is too small, ESTALE once the
// lease has ended.
func (n *leaseNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	l, errno := n.currentKept(ctx, "getxattr")
	if errno != 0 {
		return 0, errno
	}
	v, ok := n.fsys.xattrValue(l, attr)
	if !ok {
		return 0, syscall.ENODATA
	}
	if len(dest) == 0 {
		return uint32(len(v)), 0
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

// Listxattr lists the status fields as "user.lease.<field>" names.
func (n *leaseNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	l, errno := n.current(ctx)
	if errno != 0 {
		return 0, errno
	}
	var b strings.Builder
	for _, f := range leasecore.StatusFields(l) {
		b.WriteString(XattrPrefix + f.Key)
		b.WriteByte(0)
	}
	if len(dest) == 0 {
		return uint32(b.Len()), 0
	}
	if len(dest) < b.Len() {
		return uint32(b.Len()), syscall.ERANGE
	}
	return uint32(copy(dest, b.String())), 0
}

// Setxattr is refused with EPERM: the attributes are read-only.
func (n *leaseNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return n.fsys.refuse("setxattr", n.resource, callerOf(ctx), syscall.EPERM, "lease attributes are read-only")
}

// Removexattr is refused with EPERM: the attributes are read-only.
func (n *leaseNode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return n.fsys.refuse("removexattr", n.resource, callerOf(ctx), syscall.EPERM, "lease attributes are read-only")
}
