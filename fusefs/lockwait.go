package fusefs

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/leasefs/leasefs/leasecore"
)

// restartWindow is how long an interrupted blocking lock wait keeps
// its place in the name's queue for the lock owner's restarted request
// (docs/PROTOCOL.md §6, "Interrupted waits").
const restartWindow = time.Second

// waitOwner names the lock owner of a blocking lock request: the open file
// it came through and the owner FUSE reports (the open file for flock, the
// process for fcntl). A request the kernel restarts after a signal has the
// same one.
type waitOwner struct {
	h     *leaseHandle
	owner uint64
}

// lockWait is one blocking acquire in the store, run by a goroutine of its
// own so that it can outlive the request that started it. grant and err
// are set before done is closed and never change after.
type lockWait struct {
	done   chan struct{}
	grant  leasecore.Grant
	err    error
	cancel context.CancelFunc
	start  time.Time
}

// startWait starts acquiring d in the store's first come, first served
// queue (docs/PROTOCOL.md §6). The wait ends with a grant, with the store's
// error, when the daemon drains ([FS.Drain]), or when the wait is
// abandoned; an interrupt of the request that started it does not end it.
func (f *FS) startWait(d leasecore.Draft) *lockWait {
	ctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(f.drained, cancel)
	w := &lockWait{done: make(chan struct{}), cancel: cancel, start: time.Now()}
	go func() {
		defer close(w.done)
		defer stop()
		w.grant, w.err = f.store.Acquire(ctx, d)
	}()
	return w
}

// parkedWaits holds the waits of interrupted lock requests until their
// lock owner restarts the request, the open file is released, or the
// restart window passes. Safe for concurrent use; mu is a leaf lock.
type parkedWaits struct {
	mu sync.Mutex
	m  map[waitOwner]parkedWait
}

// parkedWait is a wait whose request answered EINTR, and the timer that
// abandons it.
type parkedWait struct {
	w     *lockWait
	timer interface{ Stop() bool }
}

// park keeps w for owner's restarted request until abandon runs from
// after, which is time.AfterFunc outside tests. A wait parked before for
// the same owner is abandoned at once: by park, even when its timer has
// just fired, because that timer's take finds w in its place and leaves
// the old wait alone.
func (p *parkedWaits) park(owner waitOwner, w *lockWait, window time.Duration,
	after func(time.Duration, func()) interface{ Stop() bool }, abandon func(*lockWait)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[waitOwner]parkedWait)
	}
	if old, ok := p.m[owner]; ok {
		old.timer.Stop()
		go abandon(old.w)
	}
	p.m[owner] = parkedWait{w: w, timer: after(window, func() {
		if p.take(owner, w) {
			abandon(w)
		}
	})}
}

// take removes owner's parked wait if it is still w, and reports whether
// it did.
func (p *parkedWaits) take(owner waitOwner, w *lockWait) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pw, ok := p.m[owner]; ok && pw.w == w {
		delete(p.m, owner)
		return true
	}
	return false
}

// resume removes and returns owner's parked wait, nil if there is none
// (its window passed, or its request was never interrupted).
func (p *parkedWaits) resume(owner waitOwner) *lockWait {
	p.mu.Lock()
	defer p.mu.Unlock()
	pw, ok := p.m[owner]
	if !ok || !pw.timer.Stop() {
		return nil // none, or its timer fired and abandons it
	}
	delete(p.m, owner)
	return pw.w
}

// released removes the parked waits of open file h, whose last descriptor
// closed, and returns them.
func (p *parkedWaits) released(h *leaseHandle) []*lockWait {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*lockWait
	for owner, pw := range p.m {
		if owner.h == h && pw.timer.Stop() {
			delete(p.m, owner)
			out = append(out, pw.w)
		}
	}
	return out
}

// afterFunc is time.AfterFunc with the timer behind an interface, the
// default of FS.afterFunc.
func afterFunc(d time.Duration, fn func()) interface{ Stop() bool } { return time.AfterFunc(d, fn) }

// abandonWait ends wait w whose lock owner did not restart its request in
// time, or whose open file was released: it leaves the queue, and a lease
// granted to it meanwhile ends at once as abandoned, handing the name to
// the next waiter.
func (f *FS) abandonWait(w *lockWait) {
	w.cancel()
	<-w.done
	if w.err != nil {
		return
	}
	l := w.grant.Lease
	if _, err := f.store.End(context.Background(), l.ID, leasecore.StatusAbandoned); err != nil {
		if !errors.Is(err, leasecore.ErrInactive) && !errors.Is(err, leasecore.ErrClosed) {
			f.log.Error("ending a lease granted to an interrupted wait failed", "resource", l.Resource, "lease", l.ID, "err", err)
		}
		return
	}
	f.log.Debug("released", "resource", l.Resource, "lease", l.ID, "reason", "granted to an interrupted wait that was not restarted")
}
