package fusefs

import (
	"context"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// manualTimers replaces FS.afterFunc: the timers fire only when the test
// says so. Safe for concurrent use.
type manualTimers struct {
	mu     sync.Mutex
	timers []*manualTimer
}

type manualTimer struct {
	mu      sync.Mutex
	fn      func()
	stopped bool
}

func (m *manualTimers) after(_ time.Duration, fn func()) interface{ Stop() bool } {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &manualTimer{fn: fn}
	m.timers = append(m.timers, t)
	return t
}

func (t *manualTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// fire runs every timer not stopped yet, as if its window had passed.
func (m *manualTimers) fire() {
	m.mu.Lock()
	timers := slices.Clone(m.timers)
	m.mu.Unlock()
	for _, t := range timers {
		if t.Stop() {
			t.fn()
		}
	}
}

// lockWaiter runs h.Setlkw for lock owner in the background; the result
// arrives on the channel.
func lockWaiter(ctx context.Context, h *leaseHandle, owner uint64) <-chan syscall.Errno {
	got := make(chan syscall.Errno, 1)
	go func() { got <- h.Setlkw(ctx, owner, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK) }()
	return got
}

// result waits for a lock call's answer.
func result(t *testing.T, what string, got <-chan syscall.Errno) syscall.Errno {
	t.Helper()
	select {
	case errno := <-got:
		return errno
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer", what)
		return 0
	}
}

// notYet checks that a lock call is still waiting.
func notYet(t *testing.T, what string, got <-chan syscall.Errno) {
	t.Helper()
	select {
	case errno := <-got:
		t.Fatalf("%s answered %v, want it still waiting", what, errno)
	default:
	}
}

// queueOfTwo builds alice's flock on q with bob's waits A (owner 2,
// interruptible) and then B (owner 3) queued behind it.
func queueOfTwo(t *testing.T) (e *testEnv, timers *manualTimers, holder, a, b *leaseHandle, interrupt func(), gotA, gotB <-chan syscall.Errno) {
	t.Helper()
	e = newEnv(t, leasecore.Options{})
	timers = &manualTimers{}
	e.fsys.afterFunc = timers.after
	n, holder := mustCreate(t, as(uidAlice), e.root, "q")
	if errno := holder.Setlk(as(uidAlice), 1, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
		t.Fatalf("holder flock: %v", errno)
	}
	a, b = openAs(t, n, uidBob, syscall.O_RDONLY), openAs(t, n, uidBob, syscall.O_RDONLY)
	ctx, interrupt := interruptible(uidBob)
	gotA = lockWaiter(ctx, a, 2)
	waitStoreWaiters(t, e.store, "q", 1)
	gotB = lockWaiter(as(uidBob), b, 3)
	waitStoreWaiters(t, e.store, "q", 2)
	return e, timers, holder, a, b, interrupt, gotA, gotB
}

// unlock releases h's flock as uid.
func unlock(t *testing.T, uid uint32, h *leaseHandle, owner uint64) {
	t.Helper()
	if errno := h.Setlk(as(uid), owner, flockLk(syscall.F_UNLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
		t.Fatalf("unlock: %v", errno)
	}
}

// An interrupted wait answers EINTR, and the same lock owner's restarted
// request (the kernel restarts it for SA_RESTART handlers) gets its place
// in the queue back: it is granted before the waiter that queued after it
// (docs/PROTOCOL.md §6, "Interrupted waits").
func TestInterruptedWaitRestartKeepsItsPlace(t *testing.T) {
	e, _, holder, a, _, interrupt, gotA, gotB := queueOfTwo(t)
	held := holderID(t, e)
	interrupt()
	if errno := result(t, "interrupted wait", gotA); errno != syscall.EINTR {
		t.Fatalf("interrupted wait = %v, want EINTR", errno)
	}
	if id := holderID(t, e); id != held {
		t.Fatalf("after the interrupt q is held by %s, want the holder's %s", id, held)
	}
	waitStoreWaiters(t, e.store, "q", 2) // the place is kept
	gotA = lockWaiter(as(uidBob), a, 2)  // the restart
	unlock(t, uidAlice, holder, 1)
	if errno := result(t, "restarted wait", gotA); errno != 0 {
		t.Fatalf("restarted wait = %v, want the lock", errno)
	}
	if l, err := e.store.Live(context.Background(), "q"); err != nil || l.ID != a.leaseID() {
		t.Fatalf("after the hand-over Live(q) = %+v, %v; want A's lease", l, err)
	}
	notYet(t, "B's wait", gotB)
	unlock(t, uidBob, a, 2)
	if errno := result(t, "B's wait", gotB); errno != 0 {
		t.Fatalf("B's wait = %v, want the lock", errno)
	}
}

// holderID returns the id of q's live lease.
func holderID(t *testing.T, e *testEnv) string {
	t.Helper()
	l, err := e.store.Live(context.Background(), "q")
	if err != nil {
		t.Fatalf("Live(q): %v", err)
	}
	return l.ID
}

// A wait that is not restarted within the window leaves the queue; a grant
// made to it meanwhile ends as abandoned and the name goes to the next
// waiter.
func TestInterruptedWaitNotRestarted(t *testing.T) {
	for _, grantFirst := range []bool{false, true} {
		name := "still queued"
		if grantFirst {
			name = "granted while parked"
		}
		t.Run(name, func(t *testing.T) {
			e, timers, holder, _, _, interrupt, gotA, gotB := queueOfTwo(t)
			held := holderID(t, e)
			interrupt()
			if errno := result(t, "interrupted wait", gotA); errno != syscall.EINTR {
				t.Fatalf("interrupted wait = %v, want EINTR", errno)
			}
			if grantFirst {
				unlock(t, uidAlice, holder, 1)
				waitUntil(t, "the grant to the parked wait", func() bool {
					l, err := e.store.Live(context.Background(), "q")
					return err == nil && l.ID != held
				})
				notYet(t, "B's wait", gotB)
			}
			parked := holderID(t, e)
			timers.fire()
			if !grantFirst {
				waitStoreWaiters(t, e.store, "q", 1)
				notYet(t, "B's wait", gotB)
				unlock(t, uidAlice, holder, 1)
			} else if l, err := e.store.Load(context.Background(), parked); err != nil || l.Status != leasecore.StatusAbandoned {
				t.Fatalf("the parked wait's grant after its window = %+v, %v; want abandoned", l, err)
			}
			if errno := result(t, "B's wait", gotB); errno != 0 {
				t.Fatalf("B's wait = %v, want the lock", errno)
			}
		})
	}
}

// Releasing the open file of a parked wait abandons it at once: a killed
// waiter does not keep its place.
func TestReleaseAbandonsParkedWait(t *testing.T) {
	e, _, holder, a, _, interrupt, gotA, gotB := queueOfTwo(t)
	interrupt()
	if errno := result(t, "interrupted wait", gotA); errno != syscall.EINTR {
		t.Fatalf("interrupted wait = %v, want EINTR", errno)
	}
	a.Release(as(uidBob))
	waitStoreWaiters(t, e.store, "q", 1)
	unlock(t, uidAlice, holder, 1)
	if errno := result(t, "B's wait", gotB); errno != 0 {
		t.Fatalf("B's wait = %v, want the lock", errno)
	}
}

// cancelAware is a store whose calls fail with the context's error once it
// is done, as a store that asks a cluster does.
type cancelAware struct{ leasecore.Store }

func (s cancelAware) Live(ctx context.Context, resource string) (leasecore.Lease, error) {
	if err := ctx.Err(); err != nil {
		return leasecore.Lease{}, err
	}
	return s.Store.Live(ctx, resource)
}

func (s cancelAware) Load(ctx context.Context, id string) (leasecore.Lease, error) {
	if err := ctx.Err(); err != nil {
		return leasecore.Lease{}, err
	}
	return s.Store.Load(ctx, id)
}

func (s cancelAware) Reserve(ctx context.Context, d leasecore.Draft) (leasecore.Grant, error) {
	if err := ctx.Err(); err != nil {
		return leasecore.Grant{}, err
	}
	return s.Store.Reserve(ctx, d)
}

func (s cancelAware) End(ctx context.Context, id string, st leasecore.Status) (leasecore.Lease, error) {
	if err := ctx.Err(); err != nil {
		return leasecore.Lease{}, err
	}
	return s.Store.End(ctx, id, st)
}

func (s cancelAware) Bind(ctx context.Context, id string, pid int) (leasecore.Lease, error) {
	if err := ctx.Err(); err != nil {
		return leasecore.Lease{}, err
	}
	return s.Store.Bind(ctx, id, pid)
}

// Through the protocol server, a request whose INTERRUPT has arrived (its
// cancel channel closed) still gets its real result: lookup, create, read,
// getattr, non-blocking flock, unlock and unlink all succeed on a store
// that honours cancellation. Only a blocking lock wait answers EINTR.
func TestInterruptReachesOnlyLockWaits(t *testing.T) {
	base := newEnv(t, leasecore.Options{})
	f := New(cancelAware{base.store}, Options{Logger: nil})
	f.log, f.refusalLog.log = base.fsys.log, base.fsys.log
	raw := f.RawFileSystem()
	interrupted := make(chan struct{})
	close(interrupted)
	hdr := func(node uint64) fuse.InHeader {
		return fuse.InHeader{NodeId: node, Caller: fuse.Caller{Owner: fuse.Owner{Uid: uidAlice, Gid: uidAlice}, Pid: uint32(syscall.Getpid())}}
	}
	var out fuse.CreateOut
	in := fuse.CreateIn{InHeader: hdr(1), Flags: syscall.O_CREAT | syscall.O_EXCL | syscall.O_RDWR, Mode: 0o644}
	if st := raw.Create(interrupted, &in, "x", &out); !st.Ok() {
		t.Fatalf("interrupted CREATE = %v", st)
	}
	node, fh := out.NodeId, out.Fh
	buf := make([]byte, 4096)
	if _, st := raw.Read(interrupted, &fuse.ReadIn{InHeader: hdr(node), Fh: fh, Size: 4096}, buf); !st.Ok() {
		t.Errorf("interrupted READ = %v", st)
	}
	var attr fuse.AttrOut
	if st := raw.GetAttr(interrupted, &fuse.GetAttrIn{InHeader: hdr(node)}, &attr); !st.Ok() {
		t.Errorf("interrupted GETATTR = %v", st)
	}
	var entry fuse.EntryOut
	if st := raw.Lookup(interrupted, ptr(hdr(1)), "x", &entry); !st.Ok() {
		t.Errorf("interrupted LOOKUP = %v", st)
	}
	lk := fuse.LkIn{InHeader: hdr(node), Fh: fh, Owner: 7, Lk: fuse.FileLock{End: offsetMax, Typ: syscall.F_WRLCK}, LkFlags: fuse.FUSE_LK_FLOCK}
	if st := raw.SetLk(interrupted, &lk); !st.Ok() {
		t.Errorf("interrupted non-blocking flock = %v", st)
	}

	// Another open file of x waits for the flock: the interrupt ends it.
	var open fuse.OpenOut
	if st := raw.Open(interrupted, &fuse.OpenIn{InHeader: hdr(node), Flags: syscall.O_RDONLY}, &open); !st.Ok() {
		t.Fatalf("interrupted OPEN = %v", st)
	}
	wait := fuse.LkIn{InHeader: hdr(node), Fh: open.Fh, Owner: 8, Lk: fuse.FileLock{End: offsetMax, Typ: syscall.F_WRLCK}, LkFlags: fuse.FUSE_LK_FLOCK}
	if st := raw.SetLkw(interrupted, &wait); st != fuse.Status(syscall.EINTR) {
		t.Errorf("interrupted blocking flock on a held name = %v, want EINTR", st)
	}
	raw.Release(interrupted, &fuse.ReleaseIn{InHeader: hdr(node), Fh: open.Fh}) // abandons the parked wait

	lk.Lk.Typ = syscall.F_UNLCK
	if st := raw.SetLk(interrupted, &lk); !st.Ok() {
		t.Errorf("interrupted unlock = %v", st)
	}
	if _, err := base.store.Live(context.Background(), "x"); err == nil {
		t.Errorf("x is still held after its interrupted unlock")
	}

	in.Flags = syscall.O_CREAT | syscall.O_EXCL | syscall.O_WRONLY
	if st := raw.Create(interrupted, &in, "y", &out); !st.Ok() {
		t.Fatalf("interrupted CREATE of y = %v", st)
	}
	if st := raw.Lookup(interrupted, ptr(hdr(1)), "y", &entry); !st.Ok() {
		t.Errorf("interrupted LOOKUP of y = %v", st)
	}
	if st := raw.Unlink(interrupted, ptr(hdr(1)), "y"); !st.Ok() {
		t.Errorf("interrupted UNLINK = %v", st)
	}
	if _, err := base.store.Live(context.Background(), "y"); err == nil {
		t.Errorf("y is still held after its interrupted unlink")
	}

	// A blocking flock that does not wait (its open reserved the free
	// name) is not cut short by its interrupt either.
	in.Flags = syscall.O_CREAT | syscall.O_RDONLY
	if st := raw.Create(interrupted, &in, "z", &out); !st.Ok() {
		t.Fatalf("interrupted CREATE of z = %v", st)
	}
	bind := fuse.LkIn{InHeader: hdr(out.NodeId), Fh: out.Fh, Owner: 9, Lk: fuse.FileLock{End: offsetMax, Typ: syscall.F_WRLCK}, LkFlags: fuse.FUSE_LK_FLOCK}
	if st := raw.SetLkw(interrupted, &bind); !st.Ok() {
		t.Errorf("interrupted blocking flock on the open file that reserved z = %v", st)
	}
	if l, err := base.store.Live(context.Background(), "z"); err != nil || l.Mode != leasecore.ModeHandle {
		t.Errorf("z after its flock = %+v, %v; want a handle lease", l, err)
	}
}

func ptr[T any](v T) *T { return &v }

// rawFS hands the node tree its own cancel channel for every request that
// carries one, except SETLKW: each such method of fuse.RawFileSystem is
// written in this package, not promoted from the embedded server.
func TestRawFSOverridesEveryCancellableRequest(t *testing.T) {
	cancel := reflect.TypeOf((<-chan struct{})(nil))
	iface := reflect.TypeOf((*fuse.RawFileSystem)(nil)).Elem()
	impl := reflect.TypeOf((*rawFS)(nil))
	for i := range iface.NumMethod() {
		m := iface.Method(i)
		if m.Type.NumIn() == 0 || m.Type.In(0) != cancel {
			continue
		}
		im, _ := impl.MethodByName(m.Name)
		file, _ := runtime.FuncForPC(im.Func.Pointer()).FileLine(im.Func.Pointer())
		promoted := file == "<autogenerated>"
		if m.Name == "SetLkw" && !promoted {
			t.Errorf("rawFS.SetLkw is overridden: a blocking lock wait must see its interrupt")
		}
		if m.Name != "SetLkw" && promoted {
			t.Errorf("rawFS.%s is promoted from the node tree: its interrupt would cancel the handler's context", m.Name)
		}
	}
}

// A wait parked again for the same lock owner just as the earlier parked
// wait's timer fired (its function has not taken that wait yet) abandons
// the earlier wait exactly once, and keeps the new one: a lease granted to
// the earlier wait is never left to nobody.
func TestParkAgainAsTheTimerFiresAbandonsTheEarlierWait(t *testing.T) {
	var p parkedWaits
	timers := &manualTimers{}
	abandoned := make(chan *lockWait, 4)
	abandon := func(w *lockWait) { abandoned <- w }
	owner := waitOwner{owner: 7}
	first, second := &lockWait{}, &lockWait{}
	p.park(owner, first, restartWindow, timers.after, abandon)
	fired := timers.timers[0]
	fired.Stop() // the timer fired; its function runs below, late
	p.park(owner, second, restartWindow, timers.after, abandon)
	fired.fn()
	select {
	case w := <-abandoned:
		if w != first {
			t.Fatalf("abandoned %p, want the first wait %p", w, first)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first wait was never abandoned")
	}
	if w := p.resume(owner); w != second {
		t.Fatalf("resume = %p, want the second wait %p", w, second)
	}
	select {
	case w := <-abandoned:
		t.Fatalf("a second abandon of %p", w)
	default:
	}
}
