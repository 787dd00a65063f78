package fusefs

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/leasecore"
)

// Inode number ranges: namespaces count up from firstDirIno; a lease's
// inode is leaseInoBase plus its generation, so it is never reused.
const (
	firstDirIno  = 2
	leaseInoBase = 1 << 40
)

// Options configure [New]. The zero value works.
type Options struct {
	// Logger receives one line per refused operation; default slog.Default().
	Logger *slog.Logger
	// ReapInterval is how often [FS.Run] ends dead leases; default a tenth
	// of the lease duration, clamped to [50ms, 1s].
	ReapInterval time.Duration
	// RootUID and RootGID own the root directory; default the daemon's.
	RootUID, RootGID uint32
}

// FS is the lease filesystem over one store. Create it with [New], serve
// [FS.RawFileSystem] with a fuse.Server, then call [FS.Run] once the mount is
// up. Its methods are safe for concurrent use.
type FS struct {
	store   leasecore.Store
	log     *slog.Logger
	opts    Options
	started time.Time
	root    *dirNode

	mu      sync.Mutex
	tokens  map[string]string // lease id → token not yet revealed (docs/PROTOCOL.md §3)
	dirInos map[string]uint64 // namespace path → inode number
	nextIno uint64

	// queues holds the blocked lock waiters of each resource, first come
	// first served; wakes the channel closed when a lease on the resource
	// ends or its queue moves (docs/PROTOCOL.md §6).
	queues map[string][]*waiter
	wakes  map[string]chan struct{}
	// posix maps an fcntl lock owner on one inode to the lease it holds.
	posix map[posixKey]string
	// requests maps an in-flight lock request to its FUSE node id; see
	// rawFS.
	requests sync.Map // <-chan struct{} → uint64
	// draining is set by [FS.Drain]: nothing new is granted.
	draining atomic.Bool

	// gone queues leases ended by a handler other than unlink, for
	// [FS.Run] to remove from the kernel's view.
	gone chan leasecore.Lease
}

// New returns the filesystem for store.
func New(store leasecore.Store, opts Options) *FS {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ReapInterval <= 0 {
		opts.ReapInterval = min(max(store.LeaseDuration()/10, 50*time.Millisecond), time.Second)
	}
	if opts.RootUID == 0 && opts.RootGID == 0 {
		opts.RootUID, opts.RootGID = uint32(os.Getuid()), uint32(os.Getgid())
	}
	f := &FS{
		store:   store,
		log:     opts.Logger,
		opts:    opts,
		started: time.Now(),
		tokens:  make(map[string]string),
		dirInos: make(map[string]uint64),
		nextIno: firstDirIno,
		queues:  make(map[string][]*waiter),
		wakes:   make(map[string]chan struct{}),
		posix:   make(map[posixKey]string),
		gone:    make(chan leasecore.Lease, 1024),
	}
	f.root = &dirNode{fsys: f}
	return f
}

// RawFileSystem returns the FUSE protocol server of the tree, with entry,
// attribute and negative timeouts of zero so that every path walk asks the
// daemon and out-of-band changes are seen at once (docs/ARCHITECTURE.md, kernel facts).
func (f *FS) RawFileSystem() fuse.RawFileSystem {
	zero := time.Duration(0)
	return &rawFS{RawFileSystem: fs.NewNodeFS(f.root, &fs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		UID:             f.opts.RootUID,
		GID:             f.opts.RootGID,
	}), fsys: f}
}

// Run ends dead leases every ReapInterval and removes leases ended outside
// unlink from the kernel's view, until ctx is done. Call it once, after the
// mount is serving. It is the only place that sends kernel notifications,
// from a goroutine of its own: a notification waits for the directory lock
// that an in-flight request may hold, and must not hold up reaping.
func (f *FS) Run(ctx context.Context) {
	notified := make(chan struct{})
	go func() {
		defer close(notified)
		for {
			select {
			case <-ctx.Done():
				return
			case l := <-f.gone:
				f.invalidate(l)
			}
		}
	}()
	defer func() { <-notified }()
	tick := time.NewTicker(f.opts.ReapInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			ended, err := f.store.Reap(ctx)
			if err != nil && ctx.Err() == nil {
				f.log.Error("reap failed", "err", err)
			}
			for _, l := range ended {
				f.ended(l)
			}
		}
	}
}

// Drain stops granting leases (creates and locks fail with EAGAIN) and ends
// every handle lease as abandoned, so their open files answer ESTALE: the
// first step of handing the state directory over to another daemon. Token
// leases are untouched. Safe to call more than once.
func (f *FS) Drain(ctx context.Context) {
	f.draining.Store(true)
	leases, err := f.store.List(ctx)
	if err != nil {
		f.log.Error("drain: listing leases failed", "err", err)
	}
	for _, l := range leases {
		if l.Mode != leasecore.ModeHandle {
			continue
		}
		if ended, err := f.store.End(ctx, l.ID, leasecore.StatusAbandoned); err == nil {
			f.log.Info("handle lease ended for handover", "resource", l.Resource, "lease", l.ID)
			f.ended(ended)
		}
	}
	f.mu.Lock()
	resources := slices.Collect(maps.Keys(f.wakes))
	f.mu.Unlock()
	for _, r := range resources {
		f.wake(r)
	}
}

// ended records that a handler ended l: the token is forgotten and the
// kernel's entry is invalidated later by [FS.Run]. Never blocks.
func (f *FS) ended(l leasecore.Lease) {
	f.forgetToken(l.ID)
	f.wake(l.Resource)
	select {
	case f.gone <- l:
	default:
		// Zero entry timeouts keep the kernel correct without the
		// notification; only inotify watchers miss IN_DELETE_SELF.
	}
}

// invalidate removes l's entry from the kernel's dentry cache if the kernel
// still knows it under that inode. Called only from Run.
func (f *FS) invalidate(l leasecore.Lease) {
	parent := f.root.EmbeddedInode()
	dir, name := splitResource(l.Resource)
	if dir != "" {
		for part := range strings.SplitSeq(dir, "/") {
			if parent = parent.GetChild(part); parent == nil {
				return
			}
		}
	}
	child := parent.GetChild(name)
	if child == nil || child.StableAttr().Ino != leaseIno(l) {
		return
	}
	if errno := parent.NotifyDelete(name, child); errno != 0 && errno != syscall.ENOENT {
		f.log.Debug("notify delete failed", "resource", l.Resource, "errno", errno)
	}
}

func (f *FS) rememberToken(id, token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens[id] = token
}

// takeToken returns and forgets the unrevealed token of lease id.
func (f *FS) takeToken(id string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tokens[id]
	delete(f.tokens, id)
	return t, ok
}

func (f *FS) forgetToken(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.tokens, id)
}

// dirIno returns the inode number of namespace path, allocating one.
func (f *FS) dirIno(path string) uint64 {
	if path == "" {
		return fuse.FUSE_ROOT_ID
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ino, ok := f.dirInos[path]
	if !ok {
		ino = f.nextIno
		f.nextIno++
		f.dirInos[path] = ino
	}
	return ino
}

// dropDirIno forgets a removed namespace's inode so a new namespace of the
// same name gets a new one.
func (f *FS) dropDirIno(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.dirInos, path)
}

// leaseIno is the inode number of lease l: fixed for the lease, never
// reused, since generations strictly increase (docs/PROTOCOL.md §1, §3).
func leaseIno(l leasecore.Lease) uint64 { return leaseInoBase + l.Generation }

// splitResource splits "a/b/c" into ("a/b", "c").
func splitResource(resource string) (dir, name string) {
	if i := strings.LastIndexByte(resource, '/'); i >= 0 {
		return resource[:i], resource[i+1:]
	}
	return "", resource
}

// joinResource joins a namespace path and a name.
func joinResource(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// nobody is the uid and gid assumed when a request carries no caller.
const nobody = 65534

// caller is the identity of the process behind a FUSE request.
type caller struct {
	uid, gid uint32
	pid      int // process (thread group) id, 0 when unknown
	tid      int // the calling thread, 0 when unknown
}

// callerOf returns the caller of the request in ctx. FUSE reports the
// calling thread; it is mapped to its process (docs/ARCHITECTURE.md, kernel facts).
func callerOf(ctx context.Context) caller {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		// Never happens under go-fuse; fail closed as an unprivileged uid.
		return caller{uid: nobody, gid: nobody}
	}
	return caller{uid: c.Uid, gid: c.Gid, pid: leasecore.ProcessTgid(int(c.Pid)), tid: int(c.Pid)}
}

// reserve reserves a token lease on resource for caller c and keeps its
// token for the first read (docs/PROTOCOL.md §3). Errors: EAGAIN while the
// daemon hands over (see [FS.Drain]), and those of [leasecore.Store.Reserve],
// a *LeaseHeldError included.
func (f *FS) reserve(ctx context.Context, resource string, c caller) (leasecore.Grant, error) {
	if f.draining.Load() {
		return leasecore.Grant{}, errDraining
	}
	g, err := f.store.Reserve(ctx, leasecore.Draft{
		Resource:  resource,
		HolderUID: c.uid,
		HolderGID: c.gid,
		HolderPID: c.pid,
	})
	if err != nil {
		return g, err
	}
	f.rememberToken(g.Lease.ID, g.Token)
	f.log.Info("reserved", "resource", resource, "lease", g.Lease.ID,
		"generation", g.Lease.Generation, "uid", c.uid, "pid", c.pid)
	return g, nil
}

// mayHold reports whether c may act as the holder of l: the holder uid or
// root (docs/PROTOCOL.md §7).
func (c caller) mayHold(l leasecore.Lease) bool { return c.uid == 0 || c.uid == l.HolderUID }

// maxLogReason bounds the reason in a refusal's log line, so that hostile
// input cannot flood the log.
const maxLogReason = 256

// refuse logs one line for a refused operation and returns errno.
func (f *FS) refuse(op, resource string, c caller, errno syscall.Errno, reason any) syscall.Errno {
	why := fmt.Sprint(reason)
	if len(why) > maxLogReason {
		why = why[:maxLogReason] + "…"
	}
	f.log.Warn("refused", "op", op, "resource", resource, "pid", c.pid, "uid", c.uid,
		"errno", errnoName(errno), "reason", why)
	return errno
}

// errnoName renders errno as its symbolic name, e.g. "EACCES", or "errno N"
// for a number Linux does not define. EWOULDBLOCK is EAGAIN on Linux, and is
// rendered so.
func errnoName(e syscall.Errno) string {
	if name := unix.ErrnoName(e); name != "" {
		return name
	}
	return fmt.Sprintf("errno %d", int(e))
}

// fillLeaseAttr sets the attributes of lease l (docs/PROTOCOL.md §3 stat row).
func (f *FS) fillLeaseAttr(l leasecore.Lease, a *fuse.Attr) {
	a.Ino = leaseIno(l)
	a.Mode = syscall.S_IFREG | 0o644
	a.Nlink = 1
	a.Uid, a.Gid = l.HolderUID, l.HolderGID
	a.Size = uint64(len(leasecore.StatusDocument(l)))
	a.Blksize = 4096
	ctime := l.HeartbeatAt
	for _, t := range []time.Time{l.TakeoverRequestedAt, l.CompletedAt} {
		if t.After(ctime) {
			ctime = t
		}
	}
	a.SetTimes(&l.HeartbeatAt, &l.HeartbeatAt, &ctime)
}
