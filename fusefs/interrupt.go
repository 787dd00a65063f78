package fusefs

import (
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The kernel sends FUSE_INTERRUPT for a request whose calling thread gets
// any signal (a timer, SIGCHLD, the Go runtime's preemption signal SIGURG),
// and go-fuse then closes the request's cancel channel, which ends the
// context a handler sees. Only a wait for another holder may end early
// (docs/PROTOCOL.md §3, "Interrupted calls"): rawFS hands every other
// request a cancel channel that never closes (nil), so that no handler and
// no store call can turn an interrupt into an errno. SetLkw, promoted from
// the node tree, keeps the real one. GETATTR, READ, WRITE, GETXATTR and
// SETLK, which may wait for a handle lease in jeopardy, get a key that
// never closes either, under which jeopardy.go finds the real one. The
// store calls keep their own bounds (docs/PROTOCOL.md §8a).

func (r *rawFS) Lookup(_ <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	return r.RawFileSystem.Lookup(nil, header, name, out)
}

func (r *rawFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) (st fuse.Status) {
	r.interruptible(cancel, func(key <-chan struct{}) { st = r.RawFileSystem.GetAttr(key, in, out) })
	return st
}

func (r *rawFS) SetAttr(_ <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	return r.RawFileSystem.SetAttr(nil, in, out)
}

func (r *rawFS) Mknod(_ <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.RawFileSystem.Mknod(nil, in, name, out)
}

func (r *rawFS) Mkdir(_ <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.RawFileSystem.Mkdir(nil, in, name, out)
}

func (r *rawFS) Unlink(_ <-chan struct{}, header *fuse.InHeader, name string) fuse.Status {
	return r.RawFileSystem.Unlink(nil, header, name)
}

func (r *rawFS) Rmdir(_ <-chan struct{}, header *fuse.InHeader, name string) fuse.Status {
	return r.RawFileSystem.Rmdir(nil, header, name)
}

func (r *rawFS) Rename(_ <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	return r.RawFileSystem.Rename(nil, in, oldName, newName)
}

func (r *rawFS) Link(_ <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.RawFileSystem.Link(nil, in, name, out)
}

func (r *rawFS) Symlink(_ <-chan struct{}, header *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	return r.RawFileSystem.Symlink(nil, header, target, name, out)
}

func (r *rawFS) Readlink(_ <-chan struct{}, header *fuse.InHeader) ([]byte, fuse.Status) {
	return r.RawFileSystem.Readlink(nil, header)
}

func (r *rawFS) Access(_ <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	return r.RawFileSystem.Access(nil, in)
}

func (r *rawFS) GetXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string, dest []byte) (n uint32, st fuse.Status) {
	r.interruptible(cancel, func(key <-chan struct{}) { n, st = r.RawFileSystem.GetXAttr(key, header, attr, dest) })
	return n, st
}

func (r *rawFS) ListXAttr(_ <-chan struct{}, header *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	return r.RawFileSystem.ListXAttr(nil, header, dest)
}

func (r *rawFS) SetXAttr(_ <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	return r.RawFileSystem.SetXAttr(nil, in, attr, data)
}

func (r *rawFS) RemoveXAttr(_ <-chan struct{}, header *fuse.InHeader, attr string) fuse.Status {
	return r.RawFileSystem.RemoveXAttr(nil, header, attr)
}

func (r *rawFS) Create(_ <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	return r.RawFileSystem.Create(nil, in, name, out)
}

func (r *rawFS) Tmpfile(_ <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	return r.RawFileSystem.Tmpfile(nil, in, out)
}

func (r *rawFS) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return r.RawFileSystem.Open(nil, in, out)
}

func (r *rawFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (res fuse.ReadResult, st fuse.Status) {
	r.interruptible(cancel, func(key <-chan struct{}) { res, st = r.RawFileSystem.Read(key, in, buf) })
	return res, st
}

func (r *rawFS) Lseek(_ <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	return r.RawFileSystem.Lseek(nil, in, out)
}

func (r *rawFS) GetLk(_ <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	return r.RawFileSystem.GetLk(nil, in, out)
}

func (r *rawFS) SetLk(cancel <-chan struct{}, in *fuse.LkIn) (st fuse.Status) {
	r.interruptible(cancel, func(key <-chan struct{}) { st = r.RawFileSystem.SetLk(key, in) })
	return st
}

func (r *rawFS) Release(_ <-chan struct{}, in *fuse.ReleaseIn) {
	r.RawFileSystem.Release(nil, in)
}

func (r *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (n uint32, st fuse.Status) {
	r.interruptible(cancel, func(key <-chan struct{}) { n, st = r.RawFileSystem.Write(key, in, data) })
	return n, st
}

func (r *rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (n uint32, st fuse.Status) {
	r.interruptible(cancel, func(key <-chan struct{}) { n, st = r.RawFileSystem.Writev(key, in, data) })
	return n, st
}

func (r *rawFS) CopyFileRange(_ <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	return r.RawFileSystem.CopyFileRange(nil, in)
}

func (r *rawFS) Ioctl(_ <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	return r.RawFileSystem.Ioctl(nil, in, inbuf, out, outbuf)
}

func (r *rawFS) Fsync(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return r.RawFileSystem.Fsync(nil, in)
}

func (r *rawFS) Fallocate(_ <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	return r.RawFileSystem.Fallocate(nil, in)
}

func (r *rawFS) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return r.RawFileSystem.OpenDir(nil, in, out)
}

func (r *rawFS) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.RawFileSystem.ReadDir(nil, in, out)
}

func (r *rawFS) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.RawFileSystem.ReadDirPlus(nil, in, out)
}

func (r *rawFS) FsyncDir(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return r.RawFileSystem.FsyncDir(nil, in)
}

func (r *rawFS) StatFs(_ <-chan struct{}, header *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	return r.RawFileSystem.StatFs(nil, header, out)
}

func (r *rawFS) Statx(_ <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	return r.RawFileSystem.Statx(nil, in, out)
}
