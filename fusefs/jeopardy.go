package fusefs

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// Handle leases in jeopardy (docs/PROTOCOL.md §8a, "Elections and
// jeopardy"): a store shared by several daemons ([leasecore.HandleOwner],
// the etcd store) may have passed a handle lease's local deadline without
// a confirmed keep-alive, and keep it for a grace period. Then the calls
// of the lease's holder process through its descriptors (read, fstat,
// fgetxattr, a renew, flock again) wait until the lease is kept alive or
// ends, and everyone else's calls are answered as usual. Such a wait is
// the one place besides a lock wait where an interrupt answers: EINTR, as
// it changed nothing, so that a holder killed meanwhile is not stuck.

// interruptsOf maps the requests that may wait for a lease in jeopardy to
// their real cancel channels; see [rawFS.interruptible]. Safe for
// concurrent use.
type interruptsOf struct{ m sync.Map } // <-chan struct{} (the request's key) → <-chan struct{} (its cancel)

// of returns the cancel channel of the request in ctx, nil when none was
// recorded.
func (r *interruptsOf) of(ctx context.Context) <-chan struct{} {
	fc, ok := ctx.(*fuse.Context)
	if !ok || fc.Cancel == nil {
		return nil
	}
	v, ok := r.m.Load(fc.Cancel)
	if !ok {
		return nil
	}
	return v.(<-chan struct{})
}

// interruptible runs call with a key of its own in place of the request's
// cancel channel, which it records for [FS.awaitKept]; when the store has
// no handle leases in jeopardy to wait for, call gets no key at all (see
// interrupt.go: no handler sees a cancel channel that closes).
func (r *rawFS) interruptible(cancel <-chan struct{}, call func(key <-chan struct{})) {
	if !r.fsys.jeopardy {
		call(nil)
		return
	}
	key := (<-chan struct{})(make(chan struct{}))
	r.fsys.interrupts.m.Store(key, cancel)
	defer r.fsys.interrupts.m.Delete(key)
	call(key)
}

// awaitKept waits, when l is a handle lease in jeopardy and c is its
// holder process, until the lease leaves jeopardy, and reports whether it
// waited (the caller then loads the lease again: it was kept alive, or it
// ended). It answers EINTR when the request is interrupted meanwhile.
func (f *FS) awaitKept(ctx context.Context, op string, c caller, l leasecore.Lease) (bool, syscall.Errno) {
	if !f.jeopardy || l.Mode != leasecore.ModeHandle || !l.Live() {
		return false, 0
	}
	ch := f.store.(leasecore.HandleOwner).Jeopardy(l.ID)
	if ch == nil || c.pid() != l.HolderPID {
		return false, 0
	}
	start := time.Now()
	select {
	case <-ch:
		f.log.Debug("holder's call answered after jeopardy", "op", op, "resource", l.Resource, "lease", l.ID,
			"pid", c.logPID(), "waited", time.Since(start).Round(time.Millisecond))
		return true, 0
	case <-f.interrupts.of(ctx):
		f.log.Debug("holder's call interrupted while its handle lease is in jeopardy", "op", op, "resource", l.Resource,
			"lease", l.ID, "pid", c.logPID(), "errno", "EINTR")
		return false, syscall.EINTR
	}
}
