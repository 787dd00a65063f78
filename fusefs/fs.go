package fusefs

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/internal/retrylog"
	"github.com/leasefs/leasefs/leasecore"
)

// Options configure [New]. The zero value works.
type Options struct {
	// Logger receives the log lines of refused operations
	// (docs/PROTOCOL.md §8b: conflicts at DEBUG, misuse rate-limited per
	// uid); default slog.Default().
	Logger *slog.Logger
	// RootUID and RootGID own the root directory; default the daemon's.
	RootUID, RootGID uint32
	// OnRefuse, when set, is called once per refused operation, after its
	// log line, with the operation as the log names it ("create", "flock",
	// "write", …) and the errno the caller gets. It runs on the request's
	// goroutine, concurrently with other requests, and must return
	// quickly.
	OnRefuse func(op string, errno syscall.Errno)
	// OnHandoff, when set, is called when a blocking lock (flock,
	// F_SETLKW) that had to acquire the name is granted, with how long
	// the wait in the store's queue took (about zero when the name was
	// free). It runs on the request's goroutine, concurrently with other
	// requests, and must return quickly.
	OnHandoff func(wait time.Duration)
}

// FS is the lease filesystem over one store. Create it with [New], serve
// [FS.RawFileSystem] with a fuse.Server, then call [FS.Run] once the mount is
// up. Its methods are safe for concurrent use.
//
// Its state is split by concern, each part with its own lock: tokens (the
// token vault), sizes (status document lengths), dirInos (namespace inode
// numbers), posix (fcntl lock owners), flushes (lock owners of the FLUSH
// requests in flight), unlinked (leases being ended by an unlink), lookups (the
// lease each thread last looked up), parked (interrupted lock waits kept for
// their restart), survivors (handle leases of previous daemons), retryEnds and
// retryUnclaimed (ends to try again). Lock order:
// leaseNode.mu, then leaseHandle.mu; the locks of those parts are leaves,
// never held while another lock is taken or the store is called. The FIFO
// queue of blocked flock waiters lives in the store ([leasecore.Store.Acquire]).
type FS struct {
	refusalLog
	store   leasecore.Store
	log     *slog.Logger
	opts    Options
	started time.Time
	root    *dirNode

	tokens  tokenVault
	sizes   docSizes
	dirInos dirInodes
	posix   posixOwners
	flushes flushOwners
	// interrupts and jeopardy: see jeopardy.go; jeopardy is set when the
	// store is a [leasecore.HandleOwner], whose handle leases may be in
	// jeopardy.
	interrupts interruptsOf
	jeopardy   bool
	unlinked   unlinkedLeases
	self       selfUnlinker
	lookups    threadLookups
	parked     parkedWaits
	// survivors are the handle leases of previous daemons kept for their
	// open files ([FS.Adopt]).
	survivors      survivorSet
	retryEnds      retrySet[handleEnd]
	retryUnclaimed retrySet[unclaimed]
	// scanTries are the failed scans of /proc for the holders of
	// survivors; only Run's goroutine uses it.
	scanTries retrylog.Tries
	// proc is where the processes holding survivors are looked up:
	// "/proc".
	proc string

	// afterFunc starts the timer of a parked lock wait: time.AfterFunc
	// outside tests.
	afterFunc func(time.Duration, func()) interface{ Stop() bool }

	// events is the store's change feed, subscribed to in New so that
	// no end is missed before Run starts.
	events <-chan leasecore.Event

	// draining is set by [FS.Drain]: nothing new is granted; drained is
	// cancelled then, ending every blocked lock wait.
	draining atomic.Bool
	drained  context.Context
	drain    context.CancelFunc
}

// New returns the filesystem for store.
func New(store leasecore.Store, opts Options) *FS {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.RootUID == 0 && opts.RootGID == 0 {
		opts.RootUID, opts.RootGID = uint32(os.Getuid()), uint32(os.Getgid())
	}
	f := &FS{
		refusalLog: newRefusalLog(opts.Logger, opts.OnRefuse),
		store:      store,
		log:        opts.Logger,
		opts:       opts,
		started:    time.Now(),
		afterFunc:  afterFunc,
		proc:       "/proc",
	}
	f.unlinked.wake = make(chan struct{}, 1)
	_, f.jeopardy = store.(leasecore.HandleOwner)
	f.drained, f.drain = context.WithCancel(context.Background())
	// The feed lives as long as the store: closing the store ends it. Run
	// follows only the ends; the renews and binds of the hot paths do not
	// wake it.
	f.events = store.Watch(context.Background(), leasecore.EventEnded)
	f.root = &dirNode{fsys: f}
	return f
}

// RawFileSystem returns the FUSE protocol server of the tree, with entry,
// attribute and negative timeouts of zero so that every path walk asks the
// daemon and out-of-band changes are seen at once (docs/ARCHITECTURE.md,
// kernel facts).
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

// Run follows the store's change feed until ctx is done or the store is
// closed: for every lease
// that ends — unlinked, released, its lock or open file released, expired,
// its holder gone, or ended by another mount — it forgets the unrevealed
// token and removes the lease from the kernel's view. This is the one path
// that follows a lease's end. Call it once, after the mount is serving. It
// is the only place that sends kernel notifications, from its own
// goroutine with no lock held: a notification sent inside a FUSE handler
// deadlocks the kernel (docs/ARCHITECTURE.md, kernel facts).
func (f *FS) Run(ctx context.Context) {
	// Survivors ([FS.Adopt]) are checked while any is left.
	check := time.NewTicker(survivorCheckEvery)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			f.checkSurvivors()
			f.retryFailedEnds()
		case ev, ok := <-f.events:
			if !ok {
				return // the store was closed
			}
			if ev.Kind == leasecore.EventEnded {
				f.survivors.forget(ev.Lease.ID)
				f.tokens.forget(ev.Lease.ID)
				f.sizes.forget(ev.Lease.ID)
				// A release by an unlink through this mount is the
				// kernel's to show (unlinkedLeases); any other end,
				// even of a lease being unlinked (the reaper was
				// first), is this one's.
				if ev.Change != leasecore.ChangeReleased {
					f.unlinked.forget(ev.Lease.ID)
					f.ended(ev.Lease)
				} else if !f.unlinked.skip(ev.Lease) {
					f.ended(ev.Lease)
				}
			}
		case <-f.unlinked.wake:
			// Releases skipped for unlinks that then failed: another
			// end won the race, and the kernel still shows the name.
			for _, l := range f.unlinked.takeRetries() {
				f.invalidate(l)
			}
		}
	}
}

// Drain stops granting leases (creates and locks fail with EAGAIN, blocked
// lock waits end with EAGAIN): the first step of handing the state
// directory over to another daemon. Leases held are untouched: a handle
// lease lives on while its open file does, and the next daemon keeps it
// (docs/PROTOCOL.md §2, "Handle leases across restarts"). Safe to call more
// than once.
func (f *FS) Drain(ctx context.Context) {
	f.draining.Store(true)
	f.drain()
}

// ended takes l, a lease the daemon ended (not an unlink through this
// mount), out of the kernel's view: by a self-unlink, which raises
// IN_DELETE on the directory (docs/PROTOCOL.md §6a), or, without its
// worker or with its queue full, by a notification. Called only from Run.
func (f *FS) ended(l leasecore.Lease) {
	if !f.kernelKnows(l) {
		return
	}
	if !f.self.enqueue(l) {
		f.invalidate(l)
	}
}

// invalidate removes l's entry from the kernel's dentry cache if the kernel
// still knows it under that inode. Called only from Run and the self-unlink
// worker, never from a FUSE handler.
func (f *FS) invalidate(l leasecore.Lease) {
	parent, name, child := f.treeEntry(l.Resource)
	if child == nil || child.StableAttr().Ino != leaseIno(l) {
		return
	}
	if errno := parent.NotifyDelete(name, child); errno != 0 && errno != syscall.ENOENT {
		f.log.Debug("notify delete failed", "resource", l.Resource, "errno", errno)
	}
}

// treeEntry returns the inode-tree entry of resource: its directory's
// inode, its name there, and its inode (nil child when the tree, and so the
// kernel, does not have it; nil parent too when its directory is missing).
func (f *FS) treeEntry(resource string) (parent *fs.Inode, name string, child *fs.Inode) {
	parent = f.root.EmbeddedInode()
	dir, name := splitResource(resource)
	if dir != "" {
		for part := range strings.SplitSeq(dir, "/") {
			if parent = parent.GetChild(part); parent == nil {
				return nil, name, nil
			}
		}
	}
	return parent, name, parent.GetChild(name)
}

// reserve reserves a token lease on resource for caller c and keeps its
// token for the first read (docs/PROTOCOL.md §3). Errors: errDraining
// (EAGAIN) while the daemon hands over (see [FS.Drain]), and those of
// [leasecore.Store.Reserve], a *LeaseHeldError included.
func (f *FS) reserve(ctx context.Context, resource string, c caller) (leasecore.Grant, error) {
	if f.draining.Load() {
		return leasecore.Grant{}, errDraining
	}
	g, err := f.store.Reserve(ctx, leasecore.Draft{
		Resource:  resource,
		HolderUID: c.uid,
		HolderGID: c.gid,
		HolderPID: c.pid(),
	})
	if err != nil {
		return g, err
	}
	f.tokens.put(g.Lease.ID, g.Token)
	f.log.Debug("reserved", "resource", resource, "lease", g.Lease.ID,
		"generation", g.Lease.Generation, "uid", c.uid, "pid", c.logPID())
	return g, nil
}

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

// fillLeaseAttr sets the attributes of lease l (docs/PROTOCOL.md §3, stat).
func (f *FS) fillLeaseAttr(l leasecore.Lease, a *fuse.Attr) {
	a.Ino = leaseIno(l)
	a.Mode = syscall.S_IFREG | 0o644
	a.Nlink = 1
	a.Uid, a.Gid = l.HolderUID, l.HolderGID
	a.Size = f.sizes.size(l)
	a.Blksize = 4096
	ctime := l.HeartbeatAt
	for _, t := range []time.Time{l.TakeoverRequestedAt, l.CompletedAt} {
		if t.After(ctime) {
			ctime = t
		}
	}
	a.SetTimes(&l.HeartbeatAt, &l.HeartbeatAt, &ctime)
}
