package fusefs

import (
	"context"
	"errors"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// dirNode is the root or a namespace directory: mode 01777 (world-writable
// and sticky, like /tmp, docs/PROTOCOL.md §7).
type dirNode struct {
	fs.Inode
	fsys *FS
	path string // "" for the root
}

var (
	_ = (fs.NodeLookuper)((*dirNode)(nil))
	_ = (fs.NodeGetattrer)((*dirNode)(nil))
	_ = (fs.NodeSetattrer)((*dirNode)(nil))
	_ = (fs.NodeReaddirer)((*dirNode)(nil))
	_ = (fs.NodeCreater)((*dirNode)(nil))
	_ = (fs.NodeUnlinker)((*dirNode)(nil))
	_ = (fs.NodeMkdirer)((*dirNode)(nil))
	_ = (fs.NodeRmdirer)((*dirNode)(nil))
	_ = (fs.NodeRenamer)((*dirNode)(nil))
	_ = (fs.NodeLinker)((*dirNode)(nil))
	_ = (fs.NodeSymlinker)((*dirNode)(nil))
	_ = (fs.NodeMknoder)((*dirNode)(nil))
	_ = (fs.NodeStatfser)((*dirNode)(nil))
	_ = (fs.NodeGetxattrer)((*dirNode)(nil))
	_ = (fs.NodeListxattrer)((*dirNode)(nil))
	_ = (fs.NodeSetxattrer)((*dirNode)(nil))
	_ = (fs.NodeRemovexattrer)((*dirNode)(nil))
)

// dirMode is the mode of every directory.
const dirMode = syscall.S_IFDIR | syscall.S_ISVTX | 0o777

// attr fills the attributes of the directory.
func (d *dirNode) attr(ctx context.Context, a *fuse.Attr) syscall.Errno {
	a.Ino = d.fsys.dirInos.ino(d.path)
	a.Mode = dirMode
	a.Nlink = 2
	a.Blksize = 4096
	created := d.fsys.started
	if d.path == "" {
		a.Uid, a.Gid = d.fsys.opts.RootUID, d.fsys.opts.RootGID
	} else {
		ns, err := d.fsys.store.Namespace(ctx, d.path)
		if err != nil {
			// The namespace was removed behind this node: make the
			// kernel look the path up again.
			return syscall.ESTALE
		}
		a.Uid, a.Gid = ns.UID, ns.GID
		created = ns.CreatedAt
	}
	a.SetTimes(&created, &created, &created)
	return 0
}

// Getattr returns the directory's attributes; ESTALE when the namespace was
// removed. The root's attributes never change, yet they too keep a zero
// timeout: a kernel cache of them would let stat(2) of the mountpoint
// succeed after the daemon died, hiding the ENOTCONN by which a mount left
// behind is recognised (docs/ARCHITECTURE.md, kernel facts).
func (d *dirNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	return d.attr(ctx, &out.Attr)
}

// Setattr accepts time changes as no-ops (touch) and refuses mode, owner
// and size changes with EPERM (docs/PROTOCOL.md §3).
func (d *dirNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if in.Valid&(fuse.FATTR_MODE|fuse.FATTR_UID|fuse.FATTR_GID|fuse.FATTR_SIZE) != 0 {
		return d.fsys.refuse("setattr", d.path, callerOf(ctx), syscall.EPERM, "namespaces keep mode 01777 and their owner")
	}
	return d.attr(ctx, &out.Attr)
}

// childDir returns the inode of namespace ns below d.
func (d *dirNode) childDir(ctx context.Context, ns leasecore.Namespace, out *fuse.EntryOut) *fs.Inode {
	child := &dirNode{fsys: d.fsys, path: ns.Path}
	ino := d.fsys.dirInos.ino(ns.Path)
	_ = child.attrFrom(ns, &out.Attr, ino)
	return d.NewInode(ctx, child, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino})
}

// attrFrom fills a for namespace ns without asking the store.
func (d *dirNode) attrFrom(ns leasecore.Namespace, a *fuse.Attr, ino uint64) error {
	a.Ino, a.Mode, a.Nlink, a.Blksize = ino, dirMode, 2, 4096
	a.Uid, a.Gid = ns.UID, ns.GID
	a.SetTimes(&ns.CreatedAt, &ns.CreatedAt, &ns.CreatedAt)
	return nil
}

// childLease returns the inode of lease l below d.
func (d *dirNode) childLease(ctx context.Context, l leasecore.Lease, out *fuse.EntryOut) *fs.Inode {
	d.fsys.fillLeaseAttr(l, &out.Attr)
	node := &leaseNode{fsys: d.fsys, id: l.ID, resource: l.Resource, holderUID: l.HolderUID, holderGID: l.HolderGID}
	return d.NewInode(ctx, node, fs.StableAttr{Mode: syscall.S_IFREG, Ino: leaseIno(l)})
}

// Lookup finds a namespace or a live lease named name. Errors: ENOENT,
// EINVAL and ENAMETOOLONG for invalid names.
func (d *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	resource := joinResource(d.path, name)
	if err := leasecore.ValidateName(name); err != nil {
		return nil, d.fsys.refuse("lookup", resource, callerOf(ctx), toErrno(err), err)
	}
	if d.fsys.self.self(callerTID(ctx)) {
		if node, ok := d.selfLookup(ctx, resource, out); ok {
			return node, 0
		}
		// A namespace on the worker's path: looked up as by anyone.
	}
	ns, l, err := leasecore.ReadName(ctx, d.fsys.store, resource)
	if ns != nil {
		return d.childDir(ctx, *ns, out), 0
	}
	switch {
	case errors.Is(err, leasecore.ErrNotFound):
		return nil, syscall.ENOENT
	case err != nil:
		// Not a missing name: the store failed (a commit, a cluster
		// call), which the caller sees as this errno and the log names.
		return nil, d.fsys.refuse("lookup", resource, callerOf(ctx), toErrno(err), err)
	}
	d.fsys.lookups.found(callerTID(ctx), resource, l.ID)
	return d.childLease(ctx, *l, out), 0
}

// Readdir lists the namespaces and live leases of d from one snapshot of
// the store.
func (d *dirNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	nss, leases, err := d.fsys.store.ListDir(ctx, d.path)
	if err != nil {
		return nil, d.fsys.refuse("readdir", d.path, callerOf(ctx), toErrno(err), err)
	}
	entries := make([]fuse.DirEntry, 0, len(nss)+len(leases)+2)
	entries = append(entries, fuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR, Ino: d.fsys.dirInos.ino(d.path)})
	parentIno := uint64(fuse.FUSE_ROOT_ID)
	if d.path != "" {
		parent, _ := splitResource(d.path)
		parentIno = d.fsys.dirInos.ino(parent)
	}
	entries = append(entries, fuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR, Ino: parentIno})
	for _, ns := range nss {
		_, name := splitResource(ns.Path)
		entries = append(entries, fuse.DirEntry{Name: name, Mode: syscall.S_IFDIR, Ino: d.fsys.dirInos.ino(ns.Path)})
	}
	for _, l := range leases {
		_, name := splitResource(l.Resource)
		entries = append(entries, fuse.DirEntry{Name: name, Mode: syscall.S_IFREG, Ino: leaseIno(l)})
	}
	return fs.NewListDirStream(entries), 0
}

// Create reserves a token lease on name for the caller (docs/PROTOCOL.md §3); EAGAIN
// while the daemon hands over to another (see [FS.Drain]). When the
// name has a live lease: EEXIST with O_EXCL; otherwise the existing lease is
// opened and nothing is reserved (EACCES for a non-holder opening it for
// writing). Other errors: EISDIR for a namespace, EDQUOT over the per-uid
// limit, EINVAL/ENAMETOOLONG for invalid names, ENOSPC/EIO when the store
// cannot persist.
func (d *dirNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	c := callerOf(ctx)
	resource := joinResource(d.path, name)
	if err := leasecore.ValidateName(name); err != nil {
		return nil, nil, 0, d.fsys.refuse("create", resource, c, toErrno(err), err)
	}
	g, err := d.fsys.reserve(ctx, resource, c)
	var held *leasecore.LeaseHeldError
	switch {
	case errors.As(err, &held):
		if flags&syscall.O_EXCL != 0 {
			return nil, nil, 0, d.fsys.refuse("create", resource, c, syscall.EEXIST, "held by lease "+held.Holder.ID)
		}
		if flags&syscall.O_ACCMODE != syscall.O_RDONLY && !c.mayHold(held.Holder) {
			return nil, nil, 0, d.fsys.refuse("open", resource, c, syscall.EACCES, "not the holder uid")
		}
		node := d.childLease(ctx, held.Holder, out)
		return node, node.Operations().(*leaseNode).newHandle(held.Holder, false), fuse.FOPEN_DIRECT_IO, 0
	case err != nil:
		return nil, nil, 0, d.fsys.refuse("create", resource, c, toErrno(err), err)
	}
	node := d.childLease(ctx, g.Lease, out)
	return node, node.Operations().(*leaseNode).newHandle(g.Lease, true), fuse.FOPEN_DIRECT_IO, 0
}

// Unlink releases, as complete, the lease that the kernel looked up for
// name (docs/PROTOCOL.md §3; see unlinkTarget). Errors: ENOENT when there is
// none, or when that lease ended before this could end it; EPERM when the
// caller is neither the holder uid nor root.
func (d *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	c := callerOf(ctx)
	resource := joinResource(d.path, name)
	if d.fsys.self.self(c.tid) {
		return d.selfUnlink(resource)
	}
	l, err := d.unlinkTarget(ctx, c, name, resource)
	if err != nil {
		return d.fsys.refuse("unlink", resource, c, toErrno(err), err)
	}
	if !l.Live() {
		return d.fsys.refuse("unlink", resource, c, syscall.ENOENT, "the lease it looked up has ended")
	}
	if !c.mayHold(l) {
		return d.fsys.refuse("unlink", resource, c, syscall.EPERM, "not the holder uid")
	}
	// Marked before the end is published, so that FS.Run, which may see
	// the end before this returns, leaves the kernel's view to the kernel
	// (see unlinkedLeases).
	d.fsys.unlinked.mark(l.ID)
	_, err = d.fsys.store.End(ctx, l.ID, leasecore.StatusComplete)
	d.fsys.unlinked.done(l.ID, err == nil)
	if errors.Is(err, leasecore.ErrInactive) {
		// Another end won the race (the holder's unlock or close, an
		// expiry): the name is gone, as after a racing unlink. Not
		// ESTALE, which the kernel answers by looking the name up again
		// and unlinking whatever lease holds it by then: a waiter
		// granted the name in between would lose it.
		return d.fsys.refuse("unlink", resource, c, syscall.ENOENT, "ended by another release first")
	}
	if err != nil {
		return d.fsys.refuse("unlink", resource, c, toErrno(err), err)
	}
	d.fsys.log.Debug("released", "resource", resource, "lease", l.ID, "uid", c.uid, "pid", c.logPID())
	return 0
}

// selfLookup answers a LOOKUP of the daemon's self-unlink worker from what
// the store already knows ([leasecore.Known]: no round trip to an etcd
// cluster, so that a self-unlink costs the store nothing): a live lease on
// the name (granted again after the end) as any lookup would, which the
// worker's UNLINK then refuses; otherwise the ended lease being unlinked,
// so that the kernel keeps the entry that the UNLINK removes (see
// selfUnlinker). It reports false for any other name (a namespace on the
// worker's path), which is looked up as usual.
func (d *dirNode) selfLookup(ctx context.Context, resource string, out *fuse.EntryOut) (*fs.Inode, bool) {
	if l, live, _ := leasecore.Known(ctx, d.fsys.store, resource); live {
		d.fsys.lookups.found(callerTID(ctx), resource, l.ID)
		return d.childLease(ctx, l, out), true
	}
	if ended, ok := d.fsys.self.ended(resource); ok {
		return d.childLease(ctx, ended, out), true
	}
	return nil, false
}

// selfUnlink answers an UNLINK of the daemon's self-unlink worker: it ends
// nothing. When the worker's LOOKUP found a live lease (the name was
// granted again after the end), EBUSY keeps that lease's entry and raises
// no event; otherwise the kernel removes the ended lease's entry and raises
// IN_DELETE (docs/PROTOCOL.md §6a).
func (d *dirNode) selfUnlink(resource string) syscall.Errno {
	if _, ok := d.fsys.lookups.take(int(d.fsys.self.tid.Load()), resource); ok {
		return syscall.EBUSY
	}
	if _, ok := d.fsys.self.ended(resource); !ok {
		return syscall.ENOENT
	}
	return 0
}

// unlinkTarget returns the lease an unlink of name by caller c ends: the
// one that c's own lookup for the unlink found (see threadLookups), possibly
// ended since; without a record of it, the lease of the name's node in the
// inode tree, which a lookup by another process may have replaced by a
// newer lease's; without that, the name's live lease. Errors: ErrNotFound,
// and the store's.
func (d *dirNode) unlinkTarget(ctx context.Context, c caller, name, resource string) (leasecore.Lease, error) {
	if id, ok := d.fsys.lookups.take(c.tid, resource); ok {
		return d.fsys.store.Load(ctx, id)
	}
	if child := d.GetChild(name); child != nil {
		if n, ok := child.Operations().(*leaseNode); ok {
			return d.fsys.store.Load(ctx, n.id)
		}
	}
	return d.fsys.store.Live(ctx, resource)
}

// Mkdir creates namespace name (docs/PROTOCOL.md §3). Errors: EEXIST, EINVAL,
// ENAMETOOLONG, ENOSPC/EIO.
func (d *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	c := callerOf(ctx)
	resource := joinResource(d.path, name)
	if err := leasecore.ValidateName(name); err != nil {
		return nil, d.fsys.refuse("mkdir", resource, c, toErrno(err), err)
	}
	ns, err := d.fsys.store.Mkdir(ctx, resource, c.uid, c.gid)
	if err != nil {
		return nil, d.fsys.refuse("mkdir", resource, c, toErrno(err), err)
	}
	return d.childDir(ctx, ns, out), 0
}

// Rmdir removes an empty namespace. Errors: ENOENT, ENOTEMPTY while it holds
// live leases or namespaces.
func (d *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	c := callerOf(ctx)
	resource := joinResource(d.path, name)
	if err := d.fsys.store.Rmdir(ctx, resource); err != nil {
		return d.fsys.refuse("rmdir", resource, c, toErrno(err), err)
	}
	d.fsys.dirInos.drop(resource)
	return 0
}

// Rename is refused with EPERM: a lease is bound to its name (docs/PROTOCOL.md §3).
func (d *dirNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return d.fsys.refuse("rename", joinResource(d.path, name), callerOf(ctx), syscall.EPERM, "leases cannot be renamed")
}

// Link is refused with EPERM (docs/PROTOCOL.md §3).
func (d *dirNode) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, d.fsys.refuse("link", joinResource(d.path, name), callerOf(ctx), syscall.EPERM, "leases cannot be linked")
}

// Symlink is refused with EPERM (docs/PROTOCOL.md §3).
func (d *dirNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, d.fsys.refuse("symlink", joinResource(d.path, name), callerOf(ctx), syscall.EPERM, "no symlinks in a lease directory")
}

// Mknod is refused with EPERM (docs/PROTOCOL.md §3).
func (d *dirNode) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, d.fsys.refuse("mknod", joinResource(d.path, name), callerOf(ctx), syscall.EPERM, "no device or fifo nodes in a lease directory")
}

// Statfs reports a filesystem with 255-byte names.
func (d *dirNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	out.Bsize, out.Frsize, out.NameLen = 4096, 4096, leasecore.MaxNameLen
	out.Files = 1 << 32
	out.Ffree = 1 << 31
	return 0
}

// Getxattr: directories have no lease attributes (ENODATA).
func (d *dirNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return 0, syscall.ENODATA
}

// Listxattr: directories have no attributes.
func (d *dirNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	return 0, 0
}

// Setxattr is refused with EPERM, as on a lease (docs/PROTOCOL.md §3):
// a namespace keeps no attributes.
func (d *dirNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return d.fsys.refuse("setxattr", d.path, callerOf(ctx), syscall.EPERM, "namespaces keep no attributes")
}

// Removexattr is refused with EPERM, as Setxattr is.
func (d *dirNode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return d.fsys.refuse("removexattr", d.path, callerOf(ctx), syscall.EPERM, "namespaces keep no attributes")
}
