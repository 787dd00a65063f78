package fusefs

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/internal/retrylog"
	"github.com/leasefs/leasefs/leasecore"
)

// offsetMax is the end of a whole-file lock in FUSE (OFFSET_MAX, inclusive).
const offsetMax = math.MaxInt64

// lockRequest is one SETLK/SETLKW on a lease handle.
type lockRequest struct {
	c     caller
	flock bool     // flock(2) rather than fcntl(2)
	key   posixKey // fcntl only
	owner uint64   // the lock owner FUSE reports
	// interrupt, set for a blocking request (SETLKW), is the request
	// context that the caller's FUSE_INTERRUPT ends.
	interrupt context.Context
}

// Getlk answers fcntl(F_GETLK): the holder of a live lease on the name,
// unless it is the asking lock owner, is reported as a whole-file write
// lock with the holder's pid (docs/PROTOCOL.md §6).
func (h *leaseHandle) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	*out = fuse.FileLock{Typ: syscall.F_UNLCK}
	l, err := h.fsys.store.Live(ctx, h.resource)
	if err != nil {
		return 0
	}
	if id, held := h.fsys.posix.get(posixKey{h.resource, owner}); held && id == l.ID {
		return 0
	}
	*out = fuse.FileLock{Start: 0, End: offsetMax, Typ: syscall.F_WRLCK, Pid: uint32(max(l.HolderPID, 0))}
	return 0
}

// Setlk takes or releases a lock without waiting (flock LOCK_NB, F_SETLK).
func (h *leaseHandle) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.setlk(ctx, owner, lk, flags, nil)
}

// Setlkw takes a lock, waiting first come first served while another holds
// the name (flock, F_SETLKW). A signal interrupts the wait with EINTR, and
// only the wait: ctx is the only request context whose interrupt reaches a
// handler (see interrupt.go), so every other step of the request runs
// without it.
func (h *leaseHandle) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.setlk(context.WithoutCancel(ctx), owner, lk, flags, ctx)
}

// setlk maps a lock request onto handle leases (docs/PROTOCOL.md §6).
// Errors: ENOLCK for shared and byte-range locks; EWOULDBLOCK when another
// holds the name and the caller will not wait; EINTR when a wait is
// interrupted; EAGAIN while the daemon hands over to another; ESTALE,
// ENOSPC, EIO from the store. A refused lock leaves nothing held: see
// [leaseHandle.dropUnclaimed]. A blocking request (SETLKW) has a non-nil
// interrupt, the request context that its FUSE_INTERRUPT ends; ctx is
// never cancelled.
func (h *leaseHandle) setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, interrupt context.Context) syscall.Errno {
	errno := h.trySetlk(ctx, owner, lk, flags, interrupt)
	if errno != 0 {
		h.dropUnclaimed()
	}
	return errno
}

// interruptGrace is how long an interrupted lock wait waits for the
// answer of a store call that may already have granted the lock before it
// answers EINTR: the grant that came first wins.
const interruptGrace = 20 * time.Millisecond

// errInterrupted is the result of a blocking lock wait whose request was
// interrupted before it was granted.
var errInterrupted = errors.New("fusefs: lock wait interrupted")

// wait acquires d for req's lock owner, first come, first served. It
// resumes the owner's wait that an interrupt parked, if its restart window
// has not passed, so that a request the kernel restarts after a signal
// (SA_RESTART) keeps its place in the queue (docs/PROTOCOL.md §6,
// "Interrupted waits"). When req.interrupt ends (FUSE_INTERRUPT) before the
// grant, the wait is parked and wait returns errInterrupted: nothing is
// held by this request. A grant that came first is returned even when the
// interrupt came too.
func (h *leaseHandle) wait(d leasecore.Draft, req lockRequest) (leasecore.Grant, error) {
	f := h.fsys
	owner := waitOwner{h: h, owner: req.owner}
	w := f.parked.resume(owner)
	if w == nil {
		w = f.startWait(d)
	}
	select {
	case <-w.done:
	case <-req.interrupt.Done():
		// A grant the store made just before the interrupt is on its
		// way: it is returned rather than parked if it arrives within
		// interruptGrace.
		grace := time.NewTimer(interruptGrace)
		select {
		case <-w.done:
			grace.Stop()
		case <-grace.C:
			f.parked.park(owner, w, restartWindow, f.afterFunc, f.abandonWait)
			return leasecore.Grant{}, errInterrupted
		}
	}
	if w.err == nil && f.opts.OnHandoff != nil {
		f.opts.OnHandoff(time.Since(w.start))
	}
	return w.grant, w.err
}

// dropUnclaimed ends, as abandoned, the token lease that this open file
// reserved when its token has not been read, and reports whether it did:
// the call the opener made was refused, and nobody else could ever renew or
// release that lease, so it would hold the name for a whole lease duration
// (`flock -s` on a free name: O_CREAT reserved, LOCK_SH refused; `echo
// "$tok" >| name` after that token's lease ended: O_CREAT reserved a new
// lease, the old token does not match it).
func (h *leaseHandle) dropUnclaimed() bool {
	f := h.fsys
	h.mu.Lock()
	id, reserved, bindUnknown := h.id, h.reserved, h.bindUnknown
	h.mu.Unlock()
	if !reserved {
		return false
	}
	return f.endUnclaimed(unclaimed{resource: h.resource, id: id, mayBeBound: bindUnknown})
}

// unclaimed is a reservation to end: token lease id of resource, whose
// token nobody read. mayBeBound is set when a bind of it to a lock failed
// with its outcome unknown: the store may hold it as a handle lease then,
// and that lease is ended too (no open file holds it: the lock was
// refused).
type unclaimed struct {
	resource, id string
	mayBeBound   bool
	tries        retrylog.Tries // the failed ends, when it is retried
}

// endUnclaimed ends reservation u as abandoned when its token is still
// unread, and reports whether it did. An end the store could not make (the
// cluster unreachable, the disk refusing the record) is retried by [FS.Run]
// until it lands or the token is read: the name would otherwise stay
// reserved for a lease duration that nobody can renew or release, or, as a
// handle lease on the daemon's etcd session, for ever.
func (f *FS) endUnclaimed(u unclaimed) bool {
	ended, err := f.tryEndUnclaimed(u)
	if err != nil {
		u.tries.Failed(f.log, slog.LevelError, "ending an unclaimed reservation failed; retrying", err, "resource", u.resource, "lease", u.id)
		f.retryUnclaimed.add(u.id, u)
		return false
	}
	u.tries.Succeeded(f.log, "unclaimed reservation settled after failed tries", "resource", u.resource, "lease", u.id, "ended", ended)
	return ended
}

// tryEndUnclaimed is one try of [FS.endUnclaimed]: it reports whether it
// ended u. Errors: a failure of the store worth retrying.
func (f *FS) tryEndUnclaimed(u unclaimed) (bool, error) {
	tok, unread := f.tokens.take(u.id)
	if !unread {
		return false, nil // the holder has its token: the lease is theirs to end
	}
	ctx := context.Background()
	l, err := f.store.Load(ctx, u.id)
	if err == nil && (!l.Live() || (l.Mode != leasecore.ModeToken && !u.mayBeBound)) {
		return false, nil // ended, or bound to a lock since: nothing unclaimed
	}
	if err == nil {
		l, err = f.store.End(ctx, u.id, leasecore.StatusAbandoned)
	}
	if err != nil {
		f.tokens.put(u.id, tok) // still the holder's to read meanwhile
		if errors.Is(err, leasecore.ErrInactive) || errors.Is(err, leasecore.ErrClosed) || errors.Is(err, leasecore.ErrNotFound) {
			return false, nil
		}
		return false, err
	}
	f.log.Debug("released", "resource", l.Resource, "lease", u.id, "reason", "unclaimed reservation of a refused call")
	return true, nil
}

// trySetlk is setlk without the cleanup of a refusal.
func (h *leaseHandle) trySetlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, interrupt context.Context) syscall.Errno {
	req := lockRequest{c: callerOf(ctx), flock: flags&fuse.FUSE_LK_FLOCK != 0, owner: owner, interrupt: interrupt}
	op := "fcntl"
	if req.flock {
		op = "flock"
	} else {
		if lk.Start != 0 || lk.End != offsetMax {
			return h.fsys.refuse(op, h.resource, req.c, syscall.ENOLCK, "byte-range locks are not supported: lock the whole file")
		}
		req.key = posixKey{resource: h.resource, owner: owner}
	}
	switch lk.Typ {
	case syscall.F_RDLCK:
		return h.fsys.refuse(op, h.resource, req.c, syscall.ENOLCK, "leases are exclusive: shared locks are not supported")
	case syscall.F_UNLCK:
		return h.unlock(op, req)
	case syscall.F_WRLCK:
		return h.lock(ctx, op, req)
	}
	return h.fsys.refuse(op, h.resource, req.c, syscall.EINVAL, "unknown lock type")
}

// unlock ends the handle lease held by the requesting lock owner, if any.
// A flock(2) unlock whose end the store refuses (ENOSPC, EIO: the disk is
// full) fails, and the open file still holds the lease: the end of a handle
// lease is never deferred (docs/PROTOCOL.md §6, "Choices").
func (h *leaseHandle) unlock(op string, req lockRequest) syscall.Errno {
	if !req.flock {
		if held, ok := h.fsys.posix.get(req.key); ok {
			h.mu.Lock()
			if held == h.id {
				h.unlocked = held
			}
			h.mu.Unlock()
		}
		h.fsys.posixClose(req.key)
		return 0
	}
	h.mu.Lock()
	id, bound := h.id, h.bound
	h.mu.Unlock()
	if !bound {
		return 0
	}
	l, err := h.fsys.store.End(context.Background(), id, leasecore.StatusComplete)
	switch {
	case err == nil:
		h.fsys.log.Debug("released", "resource", l.Resource, "lease", id, "reason", "unlocked")
	case errors.Is(err, leasecore.ErrInactive), errors.Is(err, leasecore.ErrClosed):
	default:
		return h.fsys.refuse(op, h.resource, req.c, toErrno(err), err)
	}
	h.mu.Lock()
	if h.id == id {
		h.bound = false
		h.unlocked = id
	}
	h.mu.Unlock()
	return 0
}

// lock binds the handle's own lease when this open file is its credential,
// or acquires the name for this open file (docs/PROTOCOL.md §6).
func (h *leaseHandle) lock(ctx context.Context, op string, req lockRequest) syscall.Errno {
	f := h.fsys
	h.mu.Lock()
	id, cred, bound := h.id, h.reserved || h.authenticated, h.bound
	h.mu.Unlock()
	if req.flock && bound {
		// flock(2) on a lock this open file already holds: a no-op, but
		// the caller is now the process that holds it. The holder's call
		// waits while the lease is in jeopardy (jeopardy.go).
		if f.jeopardy {
			if l, err := f.store.Load(ctx, id); err == nil {
				if _, errno := f.awaitKept(ctx, op, req.c, l); errno != 0 {
					return errno
				}
			}
		}
		if _, err := f.store.Bind(ctx, id, req.c.pid()); err != nil && !errors.Is(err, leasecore.ErrInactive) {
			return f.refuse(op, h.resource, req.c, toErrno(err), err)
		}
		return 0
	}
	if !req.flock {
		if held, ok := f.posix.get(req.key); ok {
			if l, err := f.store.Load(ctx, held); err == nil && l.Live() {
				return 0 // fcntl(2) by the owner that already holds it
			}
		}
	}
	if f.draining.Load() {
		return f.refuse(op, h.resource, req.c, syscall.EAGAIN, "daemon is handing over")
	}
	if !f.survivors.empty() {
		// A handle lease of a previous daemon, taken back by its holder.
		if l, err := f.store.Live(ctx, h.resource); err == nil && l.Mode == leasecore.ModeHandle {
			if taken, errno := h.takeBack(ctx, op, req, l); taken {
				return errno
			}
		}
	}
	if cred {
		l, err := f.store.Load(ctx, id)
		if err == nil && l.Live() && l.Mode == leasecore.ModeToken {
			l, err = f.store.Bind(ctx, id, req.c.pid())
			switch {
			case errors.Is(err, leasecore.ErrInactive):
				// The reservation ended between the Load and the Bind
				// (an rm, an expiry): the name may be free, and a lock
				// on a free name takes it (docs/PROTOCOL.md §6).
				return h.acquire(ctx, op, req)
			case err != nil:
				if errors.Is(err, leasecore.ErrOutcomeUnknown) {
					h.mu.Lock()
					h.bindUnknown = true
					h.mu.Unlock()
				}
				return f.refuse(op, h.resource, req.c, toErrno(err), err)
			}
			h.bindTo(l, req)
			return 0
		}
	}
	return h.acquire(ctx, op, req)
}

// bindTo makes lease l the one this open file (flock) or lock owner (fcntl)
// holds, and refers the handle to it.
func (h *leaseHandle) bindTo(l leasecore.Lease, req lockRequest) {
	f := h.fsys
	f.tokens.forget(l.ID) // once bound, the open file is the credential
	h.mu.Lock()
	h.id = l.ID
	h.snap = nil
	if req.flock {
		h.bound = true
	}
	h.mu.Unlock()
	if !req.flock {
		f.posix.set(req.key, l.ID)
		h.mu.Lock()
		h.posixKeys = append(h.posixKeys, req.key)
		h.mu.Unlock()
	}
	f.log.Debug("handle lease", "resource", l.Resource, "lease", l.ID, "generation", l.Generation,
		"uid", req.c.uid, "pid", req.c.logPID(), "flock", req.flock)
}

// acquire reserves a new handle lease on the name for this open file;
// when the request blocks and another holds the name, it waits in the store's first
// come first served queue (docs/PROTOCOL.md §6) until that lease ends, the
// caller is interrupted (EINTR, see [leaseHandle.wait]) or the daemon
// drains (EAGAIN).
func (h *leaseHandle) acquire(ctx context.Context, op string, req lockRequest) syscall.Errno {
	f := h.fsys
	d := leasecore.Draft{
		Resource:  h.resource,
		Mode:      leasecore.ModeHandle,
		HolderUID: req.c.uid,
		HolderGID: req.c.gid,
		HolderPID: req.c.pid(),
	}
	var g leasecore.Grant
	var err error
	if req.interrupt != nil {
		if g, err = h.wait(d, req); errors.Is(err, errInterrupted) {
			return f.refuse(op, h.resource, req.c, syscall.EINTR, "wait interrupted; its place in the queue is kept for a restart")
		}
	} else {
		g, err = f.store.Reserve(ctx, d)
	}
	var held *leasecore.LeaseHeldError
	switch {
	case err == nil && f.draining.Load():
		// Granted as the daemon began handing over, perhaps after Drain
		// listed the leases to end: nothing is held through a draining
		// mount.
		if _, err := f.store.End(context.Background(), g.Lease.ID, leasecore.StatusAbandoned); err != nil && !errors.Is(err, leasecore.ErrInactive) {
			f.log.Error("ending a lease granted during handover failed", "resource", h.resource, "lease", g.Lease.ID, "err", err)
		}
		return f.refuse(op, h.resource, req.c, syscall.EAGAIN, "daemon is handing over")
	case err == nil:
		// Kept even when the caller was interrupted meanwhile (its
		// FUSE_INTERRUPT ended the wait's context): the grant came first,
		// and the kernel returns this reply to the lock call, which then
		// holds the lock; a caller killed meanwhile releases it by its
		// FLUSH or RELEASE, which come after this reply.
		h.bindTo(g.Lease, req)
		return 0
	case f.draining.Load():
		return f.refuse(op, h.resource, req.c, syscall.EAGAIN, "daemon is handing over")
	case errors.As(err, &held):
		return f.refuse(op, h.resource, req.c, syscall.EWOULDBLOCK, "held by lease "+held.Holder.ID)
	}
	return f.refuse(op, h.resource, req.c, toErrno(err), err)
}

// posixClose ends the handle lease held by fcntl lock owner key: the owner
// unlocked, or closed a descriptor of the file (FLUSH), or died.
func (f *FS) posixClose(key posixKey) {
	f.posixCloseIf(key, "")
}

// posixCloseIf is posixClose, limited to lease id when id is not empty.
func (f *FS) posixCloseIf(key posixKey, id string) {
	if held, ok := f.posix.take(key, id); ok {
		f.endHandleLease(held, "fcntl lock released")
	}
}

// endHandleLease ends handle lease id as complete, if it is still live; the
// store wakes the name's first waiter and publishes the end.
//
// An end that fails (the disk refuses the record) is retried by [FS.Run]
// until it lands: the end of a handle lease is never deferred in memory
// (the next daemon would keep a lease whose open file lives), and nothing
// else would ever end it.
func (f *FS) endHandleLease(id, reason string) {
	f.tryEndHandleLease(id, handleEnd{reason: reason})
}

// handleEnd is an end of a handle lease to try again: the reason to log,
// and the failed tries.
type handleEnd struct {
	reason string
	tries  retrylog.Tries
}

// tryEndHandleLease is one try of [FS.endHandleLease]; e holds the tries
// that failed before it.
func (f *FS) tryEndHandleLease(id string, e handleEnd) {
	l, err := f.store.End(context.Background(), id, leasecore.StatusComplete)
	switch {
	case errors.Is(err, leasecore.ErrClosed):
		return // the daemon stops: the next one ends it, no process holding its open file
	case errors.Is(err, leasecore.ErrInactive):
		e.tries.Succeeded(f.log, "handle lease ended after failed tries", "lease", id) // ended otherwise
		return
	case err != nil:
		e.tries.Failed(f.log, slog.LevelError, "ending handle lease failed; retrying", err, "lease", id)
		f.retryEnds.add(id, e)
		return
	}
	e.tries.Succeeded(f.log, "handle lease ended after failed tries", "resource", l.Resource, "lease", id)
	f.log.Debug("released", "resource", l.Resource, "lease", id, "reason", e.reason)
}
