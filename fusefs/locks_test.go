package fusefs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// flockLk is a whole-file lock of type typ, as flock(2) sends it.
func flockLk(typ uint32) *fuse.FileLock {
	return &fuse.FileLock{Typ: typ, Start: 0, End: offsetMax}
}

// interruptible returns a request context of uid whose INTERRUPT is
// delivered by calling the returned function.
func interruptible(uid uint32) (*fuse.Context, func()) {
	cancel := make(chan struct{})
	ctx := &fuse.Context{Caller: fuse.Caller{Owner: fuse.Owner{Uid: uid, Gid: uid}, Pid: uint32(os.Getpid())}, Cancel: cancel}
	return ctx, func() { close(cancel) }
}

// openAs opens the lease node n as uid with flags.
func openAs(t *testing.T, n *leaseNode, uid uint32, flags uint32) *leaseHandle {
	t.Helper()
	fh, _, errno := n.Open(as(uid), flags)
	if errno != 0 {
		t.Fatalf("Open as %d: %v", uid, errno)
	}
	return fh.(*leaseHandle)
}

// waitStoreWaiters waits until the live lease on resource shows n waiters.
func waitStoreWaiters(t *testing.T, s leasecore.Store, resource string, n int) {
	t.Helper()
	waitUntil(t, "waiters on "+resource, func() bool {
		l, err := s.Live(context.Background(), resource)
		return err == nil && l.Waiters == n
	})
}

// handOff blocks waiter (bob) in flock on resource behind holder (alice),
// unlocks the holder and checks that the waiter is granted.
func handOff(t *testing.T, s leasecore.Store, resource string, holder, waiter *leaseHandle) {
	t.Helper()
	granted := make(chan syscall.Errno, 1)
	go func() { granted <- waiter.Setlkw(as(uidBob), 2, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK) }()
	waitStoreWaiters(t, s, resource, 1)
	if errno := holder.Setlk(as(uidAlice), 1, flockLk(syscall.F_UNLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
		t.Fatalf("holder unlock: %v", errno)
	}
	select {
	case errno := <-granted:
		if errno != 0 {
			t.Fatalf("waiter's flock = %v", errno)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not granted after the holder unlocked")
	}
}

// A blocked flock waiter is granted when the holder unlocks: the store's
// end of the holder's lease wakes it. The reaper never runs during the test
// and nothing polls, so nothing else could.
func TestFlockWaiterWokenByUnlock(t *testing.T) {
	e := newEnv(t, leasecore.Options{ReapInterval: time.Hour})
	n, h1 := mustCreate(t, as(uidAlice), e.root, "q")
	if errno := h1.Setlk(as(uidAlice), 1, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
		t.Fatalf("holder flock: %v", errno)
	}
	h2 := openAs(t, n, uidBob, syscall.O_RDONLY)
	held := h1.leaseID()
	handOff(t, e.store, "q", h1, h2)
	l, err := e.store.Live(context.Background(), "q")
	if err != nil || l.ID == held || l.ID != h2.leaseID() || l.Mode != leasecore.ModeHandle || l.HolderUID != uidBob {
		t.Fatalf("after the handoff the lease is %+v, %v; want a handle lease of bob bound to the waiter", l, err)
	}
}

// An interrupted wait answers EINTR and leaves nothing reserved; its place
// in the queue is kept until the restart window passes, then nothing is
// queued either.
func TestFlockWaitInterrupted(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	timers := &manualTimers{}
	e.fsys.afterFunc = timers.after
	n, _ := mustCreate(t, as(uidAlice), e.root, "q")
	holder, _ := e.store.Live(context.Background(), "q")
	h2 := openAs(t, n, uidBob, syscall.O_RDONLY)
	ctx, interrupt := interruptible(uidBob)
	got := lockWaiter(ctx, h2, 2)
	waitStoreWaiters(t, e.store, "q", 1)
	interrupt()
	if errno := result(t, "interrupted flock", got); errno != syscall.EINTR {
		t.Fatalf("interrupted flock = %v, want EINTR", errno)
	}
	if l, err := e.store.Live(context.Background(), "q"); err != nil || l.ID != holder.ID || l.Waiters != 1 {
		t.Fatalf("within the restart window the lease is %+v, %v; want the holder's with its waiter's place kept", l, err)
	}
	timers.fire()
	waitStoreWaiters(t, e.store, "q", 0)
	if l, err := e.store.Live(context.Background(), "q"); err != nil || l.ID != holder.ID {
		t.Fatalf("after an interrupted wait the lease is %+v, %v; want the holder's", l, err)
	}
}

// Drain ends blocked waits with EAGAIN.
func TestDrainEndsWaits(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	n, _ := mustCreate(t, as(uidAlice), e.root, "q")
	h2 := openAs(t, n, uidBob, syscall.O_RDONLY)
	got := make(chan syscall.Errno, 1)
	go func() { got <- h2.Setlkw(as(uidBob), 2, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK) }()
	waitStoreWaiters(t, e.store, "q", 1)
	e.fsys.Drain(context.Background())
	if errno := <-got; errno != syscall.EAGAIN {
		t.Fatalf("wait during a drain = %v, want EAGAIN", errno)
	}
}

// afterAcquire is a store that runs hook after each Acquire returns, before
// the caller sees the result: what happens in that instant (an INTERRUPT,
// the start of a drain) races the grant.
type afterAcquire struct {
	leasecore.Store
	hook func()
}

func (s afterAcquire) Acquire(ctx context.Context, d leasecore.Draft) (leasecore.Grant, error) {
	g, err := s.Store.Acquire(ctx, d)
	s.hook()
	return g, err
}

// A blocking flock granted in the instant the daemon begins to hand over
// (after Drain listed the handle leases to end) answers EAGAIN and ends the
// grant: nothing is held through a draining mount. An INTERRUPT in that
// instant keeps the grant.
func TestFlockGrantRacingTheEndOfItsWait(t *testing.T) {
	for _, drain := range []bool{true, false} {
		name := "interrupted"
		if drain {
			name = "draining"
		}
		t.Run(name, func(t *testing.T) {
			base := newEnv(t, leasecore.Options{})
			ctx, interrupt := interruptible(uidBob)
			var f *FS
			f = New(afterAcquire{Store: base.store, hook: func() {
				if drain {
					f.draining.Store(true)
				} else {
					interrupt()
				}
			}}, Options{Logger: slog.New(slog.DiscardHandler)})
			_ = f.RawFileSystem()
			n, h1 := mustCreate(t, as(uidAlice), f.root, "q")
			if errno := h1.Setlk(as(uidAlice), 1, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
				t.Fatalf("holder flock: %v", errno)
			}
			h2 := openAs(t, n, uidBob, syscall.O_RDONLY)
			got := make(chan syscall.Errno, 1)
			go func() { got <- h2.Setlkw(ctx, 2, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK) }()
			waitStoreWaiters(t, base.store, "q", 1)
			if errno := h1.Setlk(as(uidAlice), 1, flockLk(syscall.F_UNLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
				t.Fatalf("holder unlock: %v", errno)
			}
			errno := <-got
			l, err := base.store.Live(context.Background(), "q")
			switch {
			case drain && errno != syscall.EAGAIN:
				t.Fatalf("flock granted during a drain = %v, want EAGAIN", errno)
			case drain && !errors.Is(err, leasecore.ErrNotFound):
				t.Fatalf("after a grant refused for the drain, Live(q) = %+v, %v; want no live lease", l, err)
			case !drain && errno != 0:
				t.Fatalf("flock granted as it was interrupted = %v, want 0", errno)
			case !drain && (err != nil || l.ID != h2.leaseID() || l.HolderUID != uidBob):
				t.Fatalf("after a grant that raced an interrupt, Live(q) = %+v, %v; want bob's lease bound to the waiter", l, err)
			}
		})
	}
}

// A refused lock ends the reservation its own open made, if the token was
// never read; a claimed reservation stays.
func TestRefusedLockDropsUnclaimedReservation(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	_, h := mustCreate(t, as(uidAlice), e.root, "x")
	id := h.leaseID()
	if errno := h.Setlk(as(uidAlice), 1, flockLk(syscall.F_RDLCK), fuse.FUSE_LK_FLOCK); errno != syscall.ENOLCK {
		t.Fatalf("shared flock = %v, want ENOLCK", errno)
	}
	if l, err := e.store.Load(context.Background(), id); err != nil || l.Status != leasecore.StatusAbandoned {
		t.Fatalf("reservation after its lock was refused = %+v, %v; want abandoned", l, err)
	}

	_, h = mustCreate(t, as(uidAlice), e.root, "y")
	readToken(t, as(uidAlice), h)
	if errno := h.Setlk(as(uidAlice), 1, flockLk(syscall.F_RDLCK), fuse.FUSE_LK_FLOCK); errno != syscall.ENOLCK {
		t.Fatalf("shared flock = %v, want ENOLCK", errno)
	}
	if _, err := e.store.Live(context.Background(), "y"); err != nil {
		t.Fatalf("a reservation whose token was read ended with a refused lock: %v", err)
	}
}

// A renew through an open that reserved a free name ("echo $tok >| name"
// after that token's lease ended) answers ESTALE and releases the
// reservation the open made, which nobody could claim.
func TestStaleTokenWriteDropsReservation(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	_, h := mustCreate(t, as(uidAlice), e.root, "x")
	id := h.leaseID()
	if errno := write(as(uidAlice), h, "hwl_"+strings.Repeat("a", 39)); errno != syscall.ESTALE {
		t.Fatalf("renew with another lease's token through a fresh reservation = %v, want ESTALE", errno)
	}
	if l, err := e.store.Load(context.Background(), id); err != nil || l.Status != leasecore.StatusAbandoned {
		t.Fatalf("the fresh reservation after the refused renew = %+v, %v; want abandoned", l, err)
	}
	// A wrong token on a lease whose token was read is only refused.
	_, h = mustCreate(t, as(uidAlice), e.root, "y")
	readToken(t, as(uidAlice), h)
	if errno := write(as(uidAlice), h, "hwl_"+strings.Repeat("a", 39)); errno != syscall.EACCES {
		t.Fatalf("wrong token on a claimed lease = %v, want EACCES", errno)
	}
	if _, err := e.store.Live(context.Background(), "y"); err != nil {
		t.Fatalf("a claimed lease ended with a wrong token: %v", err)
	}
}

// lostAnswers is a store whose Bind is applied but answered as an outage
// with its outcome unknown (the cluster committed it and the answer was
// lost in a leader election), and whose first failEnds Ends fail without
// being applied.
type lostAnswers struct {
	leasecore.Store
	failEnds int
}

func (s *lostAnswers) Bind(ctx context.Context, id string, pid int) (leasecore.Lease, error) {
	if _, err := s.Store.Bind(ctx, id, pid); err != nil {
		return leasecore.Lease{}, err
	}
	return leasecore.Lease{}, &leasecore.PersistError{Op: "etcd bound", Path: id,
		Err: fmt.Errorf("%w: context deadline exceeded", leasecore.ErrOutcomeUnknown)}
}

func (s *lostAnswers) End(ctx context.Context, id string, st leasecore.Status) (leasecore.Lease, error) {
	if s.failEnds > 0 {
		s.failEnds--
		return leasecore.Lease{}, &leasecore.PersistError{Op: "etcd end", Path: id, Err: errors.New("context deadline exceeded")}
	}
	return s.Store.End(ctx, id, st)
}

// A flock that binds a fresh reservation and is refused because the
// store could not say whether the bind landed leaves no handle lease that
// no open file holds: the reservation is ended even when the store holds
// it as a handle lease, and an end that fails is retried until it lands.
// The retries are logged as docs/PROTOCOL.md §8b ("Logs") says: the first
// failure at ERROR, each further one at DEBUG, the recovery at INFO.
func TestRefusedBindOfUnknownOutcomeEndsTheLease(t *testing.T) {
	for _, failEnds := range []int{0, 2} {
		t.Run(fmt.Sprintf("failed ends %d", failEnds), func(t *testing.T) {
			base := newEnv(t, leasecore.Options{})
			s := &lostAnswers{Store: base.store, failEnds: failEnds}
			var log bytes.Buffer
			f := New(s, Options{Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			_ = f.RawFileSystem()
			_, h := mustCreate(t, as(uidAlice), f.root, "x")
			id := h.leaseID()
			if errno := h.Setlk(as(uidAlice), 1, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != syscall.EIO {
				t.Fatalf("flock whose bind's outcome is unknown = %v, want EIO", errno)
			}
			for i := range failEnds {
				l, err := base.store.Load(context.Background(), id)
				if err != nil || !l.Live() || l.Mode != leasecore.ModeHandle {
					t.Fatalf("after %d failed ends the lease is %+v, %v; want live, held as a handle lease", i+1, l, err)
				}
				f.retryFailedEnds()
			}
			if l, err := base.store.Load(context.Background(), id); err != nil || l.Status != leasecore.StatusAbandoned {
				t.Fatalf("the reservation after its bind's outcome was unknown = %+v, %v; want abandoned", l, err)
			}
			if f.retryUnclaimed.take() != nil {
				t.Fatal("an end is still queued for a retry after it landed")
			}
			count := func(re string) int { return len(regexp.MustCompile(re).FindAllString(log.String(), -1)) }
			want := map[string]int{
				`level=ERROR msg="ending an unclaimed reservation failed; retrying" resource=x lease=\S+ err=`:                          min(failEnds, 1),
				`level=DEBUG msg="ending an unclaimed reservation failed; retrying" resource=x lease=\S+ tries=\d+ err=`:                max(failEnds-1, 0),
				`level=INFO msg="unclaimed reservation settled after failed tries" resource=x lease=\S+ ended=true tries=3 failed_for=`: min(failEnds, 1),
			}
			for re, n := range want {
				if got := count(re); got != n {
					t.Errorf("%d log lines match %s, want %d; log:\n%s", got, re, n, log.String())
				}
			}
		})
	}
}

// Text that is not a payload, written through the open file that holds a
// handle lease, becomes the holder's note in the status document
// (docs/PROTOCOL.md §4.2, "Notes"); through an open file that holds no
// lock, or over MaxNote bytes, it stays EINVAL.
func TestNoteOfTheHolder(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidAlice)
	_, h := mustCreate(t, ctx, e.root, "n")
	if errno := write(ctx, h, "locked by 42\n"); errno != syscall.EINVAL {
		t.Fatalf("text through a token lease's open file = %v, want EINVAL", errno)
	}
	_, h = mustCreate(t, ctx, e.root, "m")
	if errno := h.Setlk(ctx, 1, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
		t.Fatalf("flock: %v", errno)
	}
	if errno := write(ctx, h, "locked by 42\n"); errno != 0 {
		t.Fatalf("a note through the holding open file = %v", errno)
	}
	doc, errno := read(ctx, h, 4096, 0)
	if errno != 0 || !strings.Contains(string(doc), "\nnote = \"locked by 42\"\n") {
		t.Fatalf("status document after the note = %v:\n%s", errno, doc)
	}
	for _, bad := range []string{
		strings.Repeat("x", leasecore.MaxNote+1), // too long for a note
		"action = \"explode\"\n",                 // a malformed command
		"hwl_ oops\n",                            // a malformed token
		"client = 3\n",                           // an annotation of the wrong type
		" \n",                                    // nothing
	} {
		if errno := write(ctx, h, bad); errno != syscall.EINVAL {
			t.Errorf("write of %.20q through the holding open file = %v, want EINVAL", bad, errno)
		}
	}
	n2, _ := e.root.Lookup(ctx, "m", &fuse.EntryOut{})
	notHolding := openAs(t, n2.Operations().(*leaseNode), uidAlice, syscall.O_RDWR)
	if errno := write(ctx, notHolding, "locked by 43"); errno != syscall.EINVAL {
		t.Errorf("text through an open file that holds no lock = %v, want EINVAL", errno)
	}
	if l, err := e.store.Live(context.Background(), "m"); err != nil || l.Note != "locked by 42" {
		t.Errorf("the note after refused writes = %q, %v; want it unchanged", l.Note, err)
	}
}

// A note that arrives after the open file's own unlock ended its lease (a
// buffered write flushed at the close, as portalocker unlocks before it
// closes) is accepted and changes nothing; text meant as a payload is
// still EINVAL (docs/PROTOCOL.md §4.2, "Notes").
func TestNoteAfterOwnUnlockIsDiscarded(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidAlice)
	_, h := mustCreate(t, ctx, e.root, "p")
	if errno := h.Setlk(ctx, 1, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
		t.Fatalf("flock: %v", errno)
	}
	id := h.leaseID()
	if errno := write(ctx, h, "first"); errno != 0 {
		t.Fatalf("note while locked = %v", errno)
	}
	unlock(t, uidAlice, h, 1)
	if errno := write(ctx, h, "flushed at the close\n"); errno != 0 {
		t.Errorf("note after the own unlock = %v, want accepted", errno)
	}
	if errno := write(ctx, h, "client = \"x\"\n"); errno != syscall.EINVAL {
		t.Errorf("a command without its token after the unlock = %v, want EINVAL", errno)
	}
	if l, err := e.store.Load(context.Background(), id); err != nil || l.Live() || l.Note != "first" {
		t.Errorf("the ended lease = %s, note %q, %v; want ended with its note unchanged", l.Status, l.Note, err)
	}
}

// endsBeforeBind is a store on which every Bind finds its lease ended just
// before it (an rm, an expiry between the lock's check and its bind).
type endsBeforeBind struct{ leasecore.Store }

func (s endsBeforeBind) Bind(ctx context.Context, id string, pid int) (leasecore.Lease, error) {
	if _, err := s.Store.End(ctx, id, leasecore.StatusComplete); err != nil {
		return leasecore.Lease{}, err
	}
	return s.Store.Bind(ctx, id, pid)
}

// A lock through the open file that reserved the name, whose reservation
// ends between the lock's check and its bind, takes the free name as a new
// handle lease: never ESTALE (docs/PROTOCOL.md §6).
func TestLockWhoseReservationEndsBeforeTheBindTakesTheName(t *testing.T) {
	base := newEnv(t, leasecore.Options{})
	e := newEnvOn(t, base.clock, base.store, endsBeforeBind{base.store})
	ctx := as(uidAlice)
	_, h := mustCreate(t, ctx, e.root, "r")
	reserved := h.leaseID()
	if errno := h.Setlk(ctx, 1, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
		t.Fatalf("flock whose reservation ended before the bind = %v, want the name", errno)
	}
	l, err := e.store.Live(context.Background(), "r")
	if err != nil || l.ID == reserved || l.Mode != leasecore.ModeHandle || l.ID != h.leaseID() {
		t.Fatalf("the name after the lock = %+v, %v; want a new handle lease held by the open file", l, err)
	}
}

// Text written through the open file that held a handle lease which another
// ended (root's rm, an expiry of its etcd session) is ESTALE: the holder
// learns that it lost its lease, as a payload would tell it.
func TestNoteAfterTheLeaseWasEndedByAnotherIsESTALE(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidAlice)
	_, h := mustCreate(t, ctx, e.root, "q")
	if errno := h.Setlk(ctx, 1, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
		t.Fatalf("flock: %v", errno)
	}
	if _, err := e.store.End(context.Background(), h.leaseID(), leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if errno := write(ctx, h, "still mine?"); errno != syscall.ESTALE {
		t.Errorf("a note after another ended the lease = %v, want ESTALE", errno)
	}
}
