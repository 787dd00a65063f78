package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// memRoot is the root directory of the in-memory FUSE ceiling: the same
// system calls as leasefs's rows 1a–1d answered from a map, with no store,
// no record and, unless dur is set, no fsync. With dur (the durable
// ceiling), every change a lease store must make durable — a reservation,
// an unlink, a renewal, a lock taken, handed over or dropped — returns only
// after a group-committed fdatasync, and each ended lease leaves a record
// file written behind (hist), and nothing else. As in leasefs, a file is a
// lease: dropping its lock with no one waiting frees the name. Its methods
// are safe for concurrent use.
type memRoot struct {
	fs.Inode
	dur  *groupCommit // nil: nothing is synced
	hist *history     // nil: no record files
	ino  atomic.Uint64

	// mu guards files and every memFile's lock state. It is a leaf: nothing
	// is called while it is held (commits come after it is let go).
	mu    sync.Mutex
	files map[string]*memFile // the live leases by name
}

var (
	_ = (fs.NodeLookuper)((*memRoot)(nil))
	_ = (fs.NodeCreater)((*memRoot)(nil))
	_ = (fs.NodeUnlinker)((*memRoot)(nil))
	_ = (fs.NodeReaddirer)((*memRoot)(nil))
	_ = (fs.NodeGetattrer)((*memRoot)(nil))
)

// memFile is one lease on a name: a token, shown by the first read of the
// handle that created it, and an exclusive lock handed over first come,
// first served, as leasefs does (docs/PROTOCOL.md §6). Its lock state is
// guarded by root.mu.
type memFile struct {
	fs.Inode
	root     *memRoot
	name     string
	token    string
	reserver *memHandle   // the open that created it, until a lock binds it
	owner    uint64       // lock owner, 0 when unlocked
	queue    []*memWaiter // blocked lockers, oldest first
}

// memWaiter is one blocked locker; granted is closed once the lock is its.
type memWaiter struct {
	owner   uint64
	granted chan struct{}
}

var (
	_ = (fs.NodeOpener)((*memFile)(nil))
	_ = (fs.NodeGetattrer)((*memFile)(nil))
	_ = (fs.NodeSetattrer)((*memFile)(nil))
)

// memHandle is an open file of a memFile. Safe for concurrent use.
type memHandle struct {
	f        *memFile
	mu       sync.Mutex
	reserved bool   // this open created the file and has not read the token yet
	owner    uint64 // lock owner this handle locked with, 0 if none
}

var (
	_ = (fs.FileReader)((*memHandle)(nil))
	_ = (fs.FileWriter)((*memHandle)(nil))
	_ = (fs.FileGetlker)((*memHandle)(nil))
	_ = (fs.FileSetlker)((*memHandle)(nil))
	_ = (fs.FileSetlkwer)((*memHandle)(nil))
	_ = (fs.FileReleaser)((*memHandle)(nil))
	_ = (fs.FileFlusher)((*memHandle)(nil))
)

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "tok_" + hex.EncodeToString(b[:])
}

// commit makes the caller's change durable when r is the durable ceiling.
func (r *memRoot) commit() syscall.Errno {
	if r.dur == nil || r.dur.commit() == nil {
		return 0
	}
	return syscall.EIO
}

// newFile makes a lease on name with an inode of its own; r.mu is held.
func (r *memRoot) newFile(ctx context.Context, name string) *memFile {
	f := &memFile{root: r, name: name, token: newToken()}
	r.NewInode(ctx, f, fs.StableAttr{Mode: syscall.S_IFREG, Ino: 1<<40 + r.ino.Add(1)})
	r.files[name] = f
	return f
}

func (r *memRoot) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o777
	return 0
}

func (r *memRoot) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	r.mu.Lock()
	f := r.files[name]
	r.mu.Unlock()
	if f == nil {
		return nil, syscall.ENOENT
	}
	f.fill(&out.Attr)
	return &f.Inode, 0
}

func (r *memRoot) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	r.mu.Lock()
	if f := r.files[name]; f != nil {
		r.mu.Unlock()
		if flags&syscall.O_EXCL != 0 {
			return nil, nil, 0, syscall.EEXIST
		}
		f.fill(&out.Attr)
		return &f.Inode, &memHandle{f: f}, fuse.FOPEN_DIRECT_IO, 0
	}
	f := r.newFile(ctx, name)
	h := &memHandle{f: f, reserved: true}
	f.reserver = h
	r.mu.Unlock()
	f.fill(&out.Attr)
	if errno := r.commit(); errno != 0 {
		return nil, nil, 0, errno
	}
	return &f.Inode, h, fuse.FOPEN_DIRECT_IO, 0
}

func (r *memRoot) Unlink(ctx context.Context, name string) syscall.Errno {
	r.mu.Lock()
	if r.files[name] == nil {
		r.mu.Unlock()
		return syscall.ENOENT
	}
	f := r.files[name]
	delete(r.files, name)
	r.mu.Unlock()
	r.ended(f)
	return r.commit()
}

// ended keeps the history record of lease f in the durable ceiling.
func (r *memRoot) ended(f *memFile) {
	if r.hist != nil {
		r.hist.ended(f.StableAttr().Ino)
	}
}

func (r *memRoot) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	r.mu.Lock()
	names := make([]string, 0, len(r.files))
	for n := range r.files {
		names = append(names, n)
	}
	r.mu.Unlock()
	slices.Sort(names)
	ents := make([]fuse.DirEntry, len(names))
	for i, n := range names {
		ents[i] = fuse.DirEntry{Name: n, Mode: syscall.S_IFREG}
	}
	return fs.NewListDirStream(ents), 0
}

func (f *memFile) fill(a *fuse.Attr) {
	a.Mode = syscall.S_IFREG | 0o644
	a.Size = uint64(len(f.token) + 1)
}

func (f *memFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.fill(&out.Attr)
	return 0
}

// Setattr accepts O_TRUNC and touch as no-ops, as leasefs does.
func (f *memFile) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f.fill(&out.Attr)
	return 0
}

func (f *memFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return &memHandle{f: f}, fuse.FOPEN_DIRECT_IO, 0
}

func (h *memHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.mu.Lock()
	first := h.reserved
	h.reserved = false
	h.mu.Unlock()
	doc := "status = \"active\"\n"
	if first {
		doc = h.f.token + "\n"
	}
	if off >= int64(len(doc)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData([]byte(doc[off:])), 0
}

func (h *memHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	return uint32(len(data)), h.f.root.commit()
}

func (h *memHandle) Flush(ctx context.Context) syscall.Errno { return 0 }

func (h *memHandle) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	r := h.f.root
	r.mu.Lock()
	defer r.mu.Unlock()
	*out = fuse.FileLock{Typ: syscall.F_UNLCK}
	if cur := r.files[h.f.name]; cur != nil && cur.owner != 0 && cur.owner != owner {
		*out = fuse.FileLock{Typ: syscall.F_WRLCK, End: 1<<63 - 1}
	}
	return 0
}

func (h *memHandle) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.lock(ctx, owner, lk, false)
}

func (h *memHandle) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.lock(ctx, owner, lk, true)
}

// lock takes (F_WRLCK) or drops (F_UNLCK) the exclusive lock of the name's
// current lease, as leasefs's flock acquires the name: on a free name it
// reserves a new lease, on a lease this open reserved it binds it, on a
// held one it waits behind every earlier waiter (or EAGAIN). Shared locks
// get ENOLCK, as in leasefs.
func (h *memHandle) lock(ctx context.Context, owner uint64, lk *fuse.FileLock, wait bool) syscall.Errno {
	switch lk.Typ {
	case syscall.F_UNLCK:
		return h.unlock(owner)
	case syscall.F_WRLCK:
	default:
		return syscall.ENOLCK
	}
	r := h.f.root
	r.mu.Lock()
	cur := r.files[h.f.name]
	switch {
	case cur == nil:
		cur = r.newFile(ctx, h.f.name)
		cur.owner = owner
		r.mu.Unlock()
		return h.locked(owner)
	case cur.owner == owner:
		r.mu.Unlock()
		return 0
	case cur.owner == 0 && (cur.reserver == h || cur.reserver == nil && len(cur.queue) == 0):
		cur.owner, cur.reserver = owner, nil
		r.mu.Unlock()
		return h.locked(owner)
	case !wait:
		r.mu.Unlock()
		return syscall.EAGAIN
	}
	w := &memWaiter{owner: owner, granted: make(chan struct{})}
	cur.queue = append(cur.queue, w)
	r.mu.Unlock()
	select {
	case <-w.granted:
	case <-ctx.Done():
		r.mu.Lock()
		if i := slices.Index(cur.queue, w); i >= 0 {
			cur.queue = slices.Delete(cur.queue, i, i+1)
			r.mu.Unlock()
			return syscall.EINTR
		}
		r.mu.Unlock() // granted meanwhile: keep it
	}
	return h.locked(owner)
}

// locked records that this open file holds the lock as owner and makes
// the grant durable.
func (h *memHandle) locked(owner uint64) syscall.Errno {
	h.mu.Lock()
	h.owner = owner
	h.mu.Unlock()
	return h.f.root.commit()
}

// unlock drops the lock of the name's lease if owner holds it: the oldest
// waiter gets it, or, with none, the lease ends and the name is free. The
// change is made durable.
func (h *memHandle) unlock(owner uint64) syscall.Errno {
	r := h.f.root
	r.mu.Lock()
	cur := r.files[h.f.name]
	if owner == 0 || cur == nil || cur.owner != owner {
		r.mu.Unlock()
		return 0
	}
	if len(cur.queue) > 0 {
		w := cur.queue[0]
		cur.queue = cur.queue[1:]
		cur.owner = w.owner
		close(w.granted)
		r.mu.Unlock()
		r.ended(cur) // the holder's lease ended; the waiter's is new
		return r.commit()
	}
	delete(r.files, cur.name)
	r.mu.Unlock()
	r.ended(cur)
	return r.commit()
}

// Release drops the lock this open file holds, as the kernel's last close
// of a flock owner does.
func (h *memHandle) Release(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	owner := h.owner
	h.owner = 0
	h.mu.Unlock()
	return h.unlock(owner)
}

// memfsMain serves the in-memory filesystem on the last of args until
// SIGTERM or SIGINT, then unmounts; "-durable JOURNAL" before it makes it
// the durable ceiling, committing to the file JOURNAL.
func memfsMain(args []string) error {
	root := &memRoot{files: map[string]*memFile{}}
	switch {
	case len(args) == 3 && args[0] == "-durable":
		g, err := newGroupCommit(args[1])
		if err != nil {
			return err
		}
		defer g.close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if root.hist, err = newHistory(ctx, args[1]+".records"); err != nil {
			return err
		}
		root.dur = g
	case len(args) != 1:
		return errors.New("usage: memfs [-durable JOURNAL] MOUNTPOINT")
	}
	mnt := args[len(args)-1]
	zero := time.Duration(0)
	server, err := fs.Mount(mnt, root, &fs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName: "benchmemfs", Name: "benchmemfs", Options: []string{"default_permissions"},
			DirectMount: os.Geteuid() == 0, EnableLocks: true,
			// As leasefs mounts: O_TRUNC arrives in the OPEN, no SETATTR.
			ExtraCapabilities: fuse.CAP_ATOMIC_O_TRUNC,
		},
	})
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		if err := server.Unmount(); err != nil {
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	}()
	server.Wait()
	return nil
}

// memfsRows runs rows 3a, 3b and 3c against the in-memory filesystem and
// rows 3d–3g against the durable one, each served by a re-executed copy of
// this command.
func (b *bench) memfsRows() error {
	if b.wantAny(map[string]string{"3a": nameMemL, "3b": nameMemR, "3c": nameMemH}) {
		err := b.withMemfs("memfs", false, func(mp string) error {
			if err := b.cellRow("3a", nameMemL, leaseCycle(mp, "lease")); err != nil {
				return err
			}
			if err := b.cellRow("3b", nameMemR, renewCycle(mp)); err != nil {
				return err
			}
			return b.cellRow("3c", nameMemH, handleCycle(mp, "handle"))
		})
		if err != nil {
			return err
		}
	}
	if !b.wantAny(map[string]string{"3d": nameDurL, "3e": nameDurR, "3f": nameDurH, "3g": nameDurQ}) {
		return nil
	}
	return b.withMemfs("durablefs", true, func(mp string) error {
		if err := b.cellRow("3d", nameDurL, leaseCycle(mp, "lease")); err != nil {
			return err
		}
		if err := b.cellRow("3e", nameDurR, renewCycle(mp)); err != nil {
			return err
		}
		if err := b.cellRow("3f", nameDurH, handleCycle(mp, "handle")); err != nil {
			return err
		}
		return b.queueRow("3g", nameDurQ, mp)
	})
}

// withMemfs mounts the in-memory filesystem (durable: the durable ceiling,
// its journal in the bench's temporary directory) on a new directory dir
// of it, runs rows on the mountpoint and stops it.
func (b *bench) withMemfs(dir string, durable bool, rows func(mp string) error) error {
	mp := filepath.Join(b.tmp, dir)
	if err := os.MkdirAll(mp, 0o755); err != nil {
		return err
	}
	args := []string{mp}
	if durable {
		args = []string{"-durable", filepath.Join(b.tmp, dir+".journal"), mp}
	}
	cmd, err := selfCommand("memfs", args...)
	if err != nil {
		return err
	}
	c, err := b.spawn(dir, mp, cmd)
	if err != nil {
		return err
	}
	defer c.stop()
	if _, err := c.waitMounted(time.Now(), 30*time.Second); err != nil {
		return fmt.Errorf("in-memory go-fuse (%s): %w", dir, err)
	}
	return rows(mp)
}
