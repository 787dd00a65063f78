package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// newTestStore returns a memory store on a fake clock, closed when the
// test ends; its engine is the one under test.
func newTestStore(t *testing.T) (*MemStore, *clocktest.FakeClock, string) {
	t.Helper()
	clock := clocktest.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	s := NewMemStore(leasecore.Options{Clock: clock, Host: "testhost"})
	t.Cleanup(func() { s.Close() })
	return s, clock, ""
}

// reserve reserves resource for uid 1000 and fails the test on error.
func reserve(t testing.TB, s leasecore.Store, resource string) leasecore.Grant {
	t.Helper()
	g, err := s.Reserve(context.Background(), leasecore.Draft{Resource: resource, HolderUID: 1000, HolderGID: 100, HolderPID: 4242})
	if err != nil {
		t.Fatalf("Reserve(%q): %v", resource, err)
	}
	return g
}

// The end of a lease hands the name to the first waiter before the end
// returns: a caller that reserves right after it finds the name held by
// that waiter, and cannot overtake the queue.
func TestEndHandsOffToTheFirstWaiter(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t)
	ctx := context.Background()
	holder := reserve(t, s, "x")
	type result struct {
		g   leasecore.Grant
		err error
	}
	results := make(chan result, 2)
	for pid := 101; pid <= 102; pid++ {
		go func() {
			g, err := s.Acquire(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000, HolderPID: pid, Mode: leasecore.ModeHandle})
			results <- result{g, err}
		}()
		want := pid - 100
		testenv.WaitFor(t, "the waiter queued", func() bool {
			l, err := s.Live(ctx, "x")
			return err == nil && l.Waiters == want
		})
	}
	if _, err := s.End(ctx, holder.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	l, err := s.Live(ctx, "x")
	if err != nil || l.HolderPID != 101 {
		t.Fatalf("right after the end, Live(x) = pid %d, %v; want the first waiter's (101)", l.HolderPID, err)
	}
	var held *leasecore.LeaseHeldError
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000, HolderPID: 999}); !errors.As(err, &held) || held.Holder.HolderPID != 101 {
		t.Errorf("a reserve right after the end = %v, want held by the first waiter", err)
	}
	first := <-results
	if first.err != nil || first.g.Lease.HolderPID != 101 || first.g.Lease.Waiters != 1 {
		t.Fatalf("first waiter = %+v, %v; want granted with 1 waiter behind", first.g.Lease, first.err)
	}
	if _, err := s.End(ctx, first.g.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	second := <-results
	if second.err != nil || second.g.Lease.HolderPID != 102 {
		t.Errorf("second waiter = %+v, %v; want granted", second.g.Lease, second.err)
	}
}

// A waiter that gives up leaves the queue, and the name goes to the next.
func TestCancelledWaiterPassesTheName(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t)
	ctx := context.Background()
	holder := reserve(t, s, "x")
	cctx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := s.Acquire(cctx, leasecore.Draft{Resource: "x", HolderUID: 1000, HolderPID: 101})
		gaveUp <- err
	}()
	testenv.WaitFor(t, "the first waiter queued", func() bool {
		l, err := s.Live(ctx, "x")
		return err == nil && l.Waiters == 1
	})
	next := make(chan leasecore.Grant, 1)
	go func() {
		g, err := s.Acquire(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000, HolderPID: 102})
		if err != nil {
			t.Error(err)
		}
		next <- g
	}()
	testenv.WaitFor(t, "the second waiter queued", func() bool {
		l, err := s.Live(ctx, "x")
		return err == nil && l.Waiters == 2
	})
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter = %v", err)
	}
	if _, err := s.End(ctx, holder.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if g := <-next; g.Lease.HolderPID != 102 {
		t.Errorf("the name went to pid %d, want 102", g.Lease.HolderPID)
	}
}

// A waiter granted the name in the instant its context ends (a signal
// interrupting a blocking flock as the holder releases) gets the grant: the
// lease was handed to it first, and dropping it would pass the name on
// behind the caller's back.
func TestGrantRacingCancelIsKept(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t)
	ctx := context.Background()
	holder := reserve(t, s, "x")
	cctx, cancel := context.WithCancel(ctx)
	type result struct {
		g   leasecore.Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := s.Acquire(cctx, leasecore.Draft{Resource: "x", HolderUID: 1000, HolderPID: 101, Mode: leasecore.ModeHandle})
		got <- result{g, err}
	}()
	testenv.WaitFor(t, "the waiter queued", func() bool {
		l, err := s.Live(ctx, "x")
		return err == nil && l.Waiters == 1
	})
	// Hand the name to the waiter and end its context before it can run.
	endHolderThen(t, s, holder.Lease.ID, cancel)
	r := <-got
	if r.err != nil || r.g.Lease.HolderPID != 101 {
		t.Fatalf("Acquire = %+v, %v; want the grant made before the cancellation", r.g.Lease, r.err)
	}
	if l, err := s.Live(ctx, "x"); err != nil || l.ID != r.g.Lease.ID {
		t.Errorf("Live(x) = %+v, %v; want the granted lease %s, still live", l, err, r.g.Lease.ID)
	}
}

// A lease handed to a waiter that ends before the waiter wakes (a holder
// of the uid removed the name in between) is not returned: the waiter
// gets a live lease, here a new one once the name is free again.
func TestVoidHandOffIsNotReturned(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t)
	ctx := context.Background()
	holder := reserve(t, s, "x")
	got := make(chan leasecore.Grant, 1)
	go func() {
		g, err := s.Acquire(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000, HolderPID: 101, Mode: leasecore.ModeHandle})
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	testenv.WaitFor(t, "the waiter queued", func() bool {
		l, err := s.Live(ctx, "x")
		return err == nil && l.Waiters == 1
	})
	// End the holder (handing the name to the waiter) and, before the
	// waiter can run, end the lease it was handed.
	var voided string
	endHolderThen(t, s, holder.Lease.ID, func() {
		handed := s.live["x"]
		if handed == nil || handed.Lease.HolderPID != 101 {
			t.Fatalf("the end did not hand the name to the waiter: %+v", handed)
		}
		if err := s.endLocked(handed, handed.Lease, leasecore.StatusComplete, leasecore.ChangeReleased, "removed by another process of the uid", false); err != nil {
			t.Fatal(err)
		}
		voided = handed.Lease.ID
	})
	g := <-got
	if g.Lease.ID == voided {
		t.Fatalf("the waiter got the lease that had ended: %s", voided)
	}
	if l, err := s.Live(ctx, "x"); err != nil || l.ID != g.Lease.ID {
		t.Errorf("Live(x) = %+v, %v; want the waiter's lease %s", l, err, g.Lease.ID)
	}
}

// endHolderThen ends lease id, which hands its name to the first waiter,
// and runs then under the same hold of the store's mutex: before the woken
// waiter can run.
func endHolderThen(t *testing.T, s *MemStore, id string, then func()) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.leases[id]
	if err := s.endLocked(e, e.Lease, leasecore.StatusComplete, leasecore.ChangeReleased, "test", false); err != nil {
		t.Fatal(err)
	}
	then()
}
