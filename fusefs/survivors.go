package fusefs

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/internal/openfiles"
	"github.com/leasefs/leasefs/internal/retrylog"
	"github.com/leasefs/leasefs/leasecore"
)

// survivorCheckEvery is how often the holders of the handle leases of a
// previous daemon are checked: a lease ends within about this long (plus
// one scan of /proc) after the last descriptor of its open file is closed
// (docs/PROTOCOL.md §2, "Handle leases across restarts").
const survivorCheckEvery = 250 * time.Millisecond

// Survivor is a handle lease locked through a previous daemon's mount whose
// open file a process still held when this daemon started
// (docs/PROTOCOL.md §2, "Handle leases across restarts").
type Survivor struct {
	Lease string        // the lease id
	File  openfiles.Key // the open file it was locked on: old mount id, the lease's inode number
	PIDs  []int         // the processes holding a descriptor of it

	endTries retrylog.Tries // the ends of it that failed, when it is retried
}

// OpenFileOf returns the open file that a handle lease l locked through
// the mount with id mountID refers to: that mount and l's inode number.
func OpenFileOf(mountID int, l leasecore.Lease) openfiles.Key {
	return openfiles.Key{Mount: mountID, Ino: leaseIno(l)}
}

// survivorSet holds the [Survivor] leases this daemon keeps for their open
// files. Safe for concurrent use; its lock is a leaf.
type survivorSet struct {
	mu sync.Mutex
	m  map[string]*Survivor // lease id → survivor
}

func (s *survivorSet) get(id string) (Survivor, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[id]
	if !ok {
		return Survivor{}, false
	}
	return *v, true
}

func (s *survivorSet) empty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m) == 0
}

func (s *survivorSet) forget(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[id]
	delete(s.m, id)
	return ok
}

func (s *survivorSet) all() []Survivor {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Survivor, 0, len(s.m))
	for _, v := range s.m {
		out = append(out, *v)
	}
	return out
}

func (s *survivorSet) setPIDs(id string, pids []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.m[id]; v != nil {
		v.PIDs = pids
	}
}

// Adopt makes the handle leases in survivors this daemon's to end: each
// lives while a process holds a descriptor of its open file, and ends as
// complete within about [survivorCheckEvery] of the last one's close (a
// process that exits closes its descriptors). A holder takes its lease
// back with a lock on a new open file of the name ([leaseHandle.lock]).
// Call it before [FS.Run], which does the checking.
func (f *FS) Adopt(survivors []Survivor) {
	f.survivors.mu.Lock()
	defer f.survivors.mu.Unlock()
	if f.survivors.m == nil {
		f.survivors.m = make(map[string]*Survivor)
	}
	for _, s := range survivors {
		s.PIDs = slices.Clone(s.PIDs)
		f.survivors.m[s.Lease] = &s
	}
}

// checkSurvivors ends the survivors whose open file no process holds any
// more: a survivor none of whose known holders has it is looked for in
// every process (a child may have inherited the descriptor) before it is
// ended. Called from Run's goroutine.
func (f *FS) checkSurvivors() {
	var lost []Survivor
	for _, s := range f.survivors.all() {
		held := s.PIDs[:0:0]
		for _, pid := range s.PIDs {
			if openfiles.Holds(f.proc, pid, s.File) {
				held = append(held, pid)
			}
		}
		if len(held) == 0 {
			lost = append(lost, s)
		} else if len(held) != len(s.PIDs) {
			f.survivors.setPIDs(s.Lease, held)
		}
	}
	if len(lost) == 0 {
		return
	}
	var mounts []int
	for _, s := range lost {
		if !slices.Contains(mounts, s.File.Mount) {
			mounts = append(mounts, s.File.Mount)
		}
	}
	sc, err := openfiles.ScanMounts(f.proc, mounts, nil)
	if err != nil {
		f.scanTries.Failed(f.log, slog.LevelWarn, "cannot look for the holders of previous daemons' handle leases; retrying", err)
		return
	}
	f.scanTries.Succeeded(f.log, "looked for the holders of previous daemons' handle leases after failed tries")
	for _, s := range lost {
		if pids := sc.Holders[s.File]; len(pids) > 0 {
			f.survivors.setPIDs(s.Lease, pids)
			continue
		}
		if !f.survivors.forget(s.Lease) {
			continue // taken back or ended meanwhile
		}
		l, err := f.store.End(context.Background(), s.Lease, leasecore.StatusComplete)
		switch {
		case err == nil:
			s.endTries.Succeeded(f.log, "handle lease ended after failed tries", "resource", l.Resource, "lease", s.Lease)
			f.log.Debug("released", "resource", l.Resource, "lease", s.Lease,
				"reason", "the last descriptor of its open file, opened through a previous daemon, was closed")
		case errors.Is(err, leasecore.ErrInactive), errors.Is(err, leasecore.ErrClosed):
		default:
			// Kept for the next check: a lease nobody holds must still end.
			s.endTries.Failed(f.log, slog.LevelError, "ending handle lease failed; retrying", err, "lease", s.Lease)
			f.Adopt([]Survivor{s})
		}
	}
}

// takeBack binds live lease l, a survivor, to this open file when the
// caller still holds the survivor's open file (its /proc/PID/fdinfo shows
// it): re-binding is authorised by possession, never by pid alone
// (docs/PROTOCOL.md §6, §7). It reports whether l was a survivor the caller
// holds; errno is the outcome then.
func (h *leaseHandle) takeBack(ctx context.Context, op string, req lockRequest, l leasecore.Lease) (taken bool, errno syscall.Errno) {
	f := h.fsys
	s, ok := f.survivors.get(l.ID)
	if !ok || !(openfiles.Holds(f.proc, req.c.tid, s.File) || openfiles.Holds(f.proc, req.c.pid(), s.File)) {
		return false, 0
	}
	bound, err := f.store.Bind(ctx, l.ID, req.c.pid())
	if err != nil {
		return true, f.refuse(op, h.resource, req.c, toErrno(err), err)
	}
	f.survivors.forget(l.ID)
	h.bindTo(bound, req)
	f.log.Info("handle lease taken back", "resource", l.Resource, "lease", l.ID, "generation", l.Generation,
		"pid", req.c.logPID(), "reason", "the caller holds the open file it was locked on through a previous daemon")
	return true, 0
}

// retrySet holds the ends to try again, by lease id: a [handleEnd] for a
// handle lease ([FS.endHandleLease]), the reservation for an unclaimed one
// ([FS.endUnclaimed]), each with its failed tries. Safe for concurrent use; its lock is
// a leaf.
type retrySet[V any] struct {
	mu sync.Mutex
	m  map[string]V
}

func (r *retrySet[V]) add(id string, v V) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]V)
	}
	r.m[id] = v
}

func (r *retrySet[V]) take() map[string]V {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.m
	r.m = nil
	return m
}

// retryFailedEnds tries again the ends of handle leases and of unclaimed
// reservations that failed. Called from Run's goroutine.
func (f *FS) retryFailedEnds() {
	for id, e := range f.retryEnds.take() {
		f.tryEndHandleLease(id, e)
	}
	for _, u := range f.retryUnclaimed.take() {
		f.endUnclaimed(u)
	}
}
