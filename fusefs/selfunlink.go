package fusefs

import (
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/leasecore"
)

// selfUnlinkQueue bounds the ends waiting for a self-unlink; an end that
// finds the queue full gets the kernel notification instead (the name
// leaves the kernel's view, without IN_DELETE on the directory).
const selfUnlinkQueue = 4096

// selfUnlinker raises IN_DELETE on a directory for a lease the daemon
// itself ended (docs/PROTOCOL.md §6a): a kernel notification removes the
// name without it, so the daemon unlinks the ended name through its own
// mount, as any process would, and the kernel raises the unlink's events.
//
// The unlinks run on one goroutine locked to its OS thread, so that the
// FS knows its requests by their thread id (tid) and answers them without
// ending anything: a LOOKUP answers with the ended lease's inode while the
// name has no live lease, and the UNLINK succeeds only then (a name granted
// again meanwhile keeps its lease, and its kernel entry). They never run
// inside a FUSE handler or with a lock held (docs/ARCHITECTURE.md,
// "Self-unlinks"). Each path is reached from a descriptor of the mount's
// root opened per end and checked to be this mount (its st_dev), so that a
// lazily detached or over-mounted mountpoint is never unlinked in.
//
// Safe for concurrent use; mu is a leaf lock, never held across a system
// call.
type selfUnlinker struct {
	// tid is the worker's thread id, 0 while no worker runs.
	tid atomic.Int64
	// queue carries the ended leases to unlink; nil until started.
	queue chan leasecore.Lease

	mu sync.Mutex
	// pending maps a resource being unlinked to its ended lease.
	pending map[string]leasecore.Lease
	// stopped is set by stop: enqueue refuses from then on.
	stopped bool

	done chan struct{} // closed when the worker has returned
}

// self reports whether tid is the worker's thread.
func (u *selfUnlinker) self(tid int) bool {
	return tid != 0 && int64(tid) == u.tid.Load()
}

// ended returns the lease being unlinked under resource, if any.
func (u *selfUnlinker) ended(resource string) (leasecore.Lease, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	l, ok := u.pending[resource]
	return l, ok
}

func (u *selfUnlinker) setPending(l leasecore.Lease, on bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if on {
		if u.pending == nil {
			u.pending = make(map[string]leasecore.Lease)
		}
		u.pending[l.Resource] = l
		return
	}
	delete(u.pending, l.Resource)
}

// enqueue hands l to the worker; false when none runs or its queue is full.
func (u *selfUnlinker) enqueue(l leasecore.Lease) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.queue == nil || u.stopped {
		return false
	}
	select {
	case u.queue <- l:
		return true
	default:
		return false
	}
}

// StartSelfUnlink starts the worker that raises IN_DELETE for the ends
// the daemon makes itself, through the mount at mountpoint (docs/PROTOCOL.md
// §6a). Call it once, after the mount is up, and [FS.StopSelfUnlink] before
// unmounting. Without it, ends only leave the kernel's view (a
// notification). Errors: those of stat(2) on mountpoint.
func (f *FS) StartSelfUnlink(mountpoint string) error {
	var st unix.Stat_t
	if err := unix.Stat(mountpoint, &st); err != nil {
		return err
	}
	u := &f.self
	u.mu.Lock()
	u.queue = make(chan leasecore.Lease, selfUnlinkQueue)
	u.done = make(chan struct{})
	queue := u.queue
	u.mu.Unlock()
	started := make(chan struct{})
	go func() {
		defer close(u.done)
		// Never unlocked: the thread ends with the goroutine, so that no
		// other goroutine ever runs with this tid.
		runtime.LockOSThread()
		u.tid.Store(int64(unix.Gettid()))
		close(started)
		for l := range queue {
			f.selfUnlink(mountpoint, st.Dev, l)
		}
		u.tid.Store(0)
	}()
	<-started
	return nil
}

// StopSelfUnlink stops the worker after the unlinks it has queued, and
// waits for it, so that no call of the daemon on its own mount is in flight
// when the mount goes away (one in flight after the server stops reading
// would never return). Ends after it get the notification only. Safe to
// call more than once, and without [FS.StartSelfUnlink].
func (f *FS) StopSelfUnlink() {
	u := &f.self
	u.mu.Lock()
	if u.queue == nil || u.stopped {
		u.mu.Unlock()
		return
	}
	u.stopped = true
	close(u.queue)
	done := u.done
	u.mu.Unlock()
	<-done
}

// selfUnlink unlinks the name of ended lease l through the mount whose root
// is mountpoint on device dev, when the kernel knows the name under l's
// inode; when the unlink fails for another reason than a new lease of
// the name, it falls back to the notification. Runs on the worker only.
func (f *FS) selfUnlink(mountpoint string, dev uint64, l leasecore.Lease) {
	if !f.kernelKnows(l) {
		return
	}
	// A name granted on in the same step (a hand-over) stays taken: the
	// worker's LOOKUP then finds the new lease, and its UNLINK is refused
	// (see dirNode.selfUnlink). That LOOKUP is the one store read a
	// self-unlink costs, on a mount whose kernel knows the name only.
	errno := f.unlinkThrough(mountpoint, dev, l)
	switch errno {
	case 0:
		f.log.Debug("self-unlink", "resource", l.Resource, "lease", l.ID)
	case syscall.EBUSY:
		// Granted again: the next path walk looks the new lease up.
	case syscall.ENOENT:
		// The kernel no longer knew the name.
		f.invalidate(l)
	default:
		f.log.Debug("self-unlink failed; notifying instead", "resource", l.Resource, "lease", l.ID, "errno", errno)
		f.invalidate(l)
	}
}

// unlinkThrough does the unlinkat(2) of l's name from a descriptor of the
// mount's root, checked to be on dev.
func (f *FS) unlinkThrough(mountpoint string, dev uint64, l leasecore.Lease) syscall.Errno {
	root, err := unix.Open(mountpoint, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return errnoOf(err)
	}
	defer unix.Close(root)
	var st unix.Stat_t
	if err := unix.Fstat(root, &st); err != nil {
		return errnoOf(err)
	}
	if st.Dev != dev {
		// Detached or over-mounted: the path is another filesystem now.
		return syscall.EXDEV
	}
	dirfd := root
	dir, name := splitResource(l.Resource)
	if dir != "" {
		d, err := unix.Openat(root, dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return errnoOf(err)
		}
		defer unix.Close(d)
		if err := unix.Fstat(d, &st); err != nil || st.Dev != dev {
			return syscall.EXDEV
		}
		dirfd = d
	}
	f.self.setPending(l, true)
	defer f.self.setPending(l, false)
	return errnoOf(unix.Unlinkat(dirfd, name, 0))
}

// kernelKnows reports whether the kernel has an entry for l's name, under
// l's inode or an earlier lease's of the name (a handle lease granted to a
// waiter whose open file is of the lease before): only then is there an
// entry to remove and an event to raise ("flat in the number of mounts": a
// mount that never looked the name up pays nothing).
func (f *FS) kernelKnows(l leasecore.Lease) bool { return f.KernelKnows(l.Resource) }

// KernelKnows reports whether the kernel knows a lease inode named
// resource: one is in the mount's tree (go-fuse drops it when the kernel
// forgets it). An etcd store follows such names (docs/PROTOCOL.md §8a).
// Safe for concurrent use; it takes only go-fuse's tree locks.
func (f *FS) KernelKnows(resource string) bool {
	_, _, child := f.treeEntry(resource)
	if child == nil {
		return false
	}
	_, isLease := child.Operations().(*leaseNode)
	return isLease
}

// errnoOf returns err's errno; EIO for an error that is none.
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}
