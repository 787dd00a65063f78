package storetest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/leasecore"
)

func testReserveConflict(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	g := e.reserve("x", 1000)
	_, err := e.s.Reserve(context.Background(), leasecore.Draft{Resource: "x", HolderUID: 1001})
	var held *leasecore.LeaseHeldError
	if !errors.As(err, &held) || !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("second Reserve = %v, want a *LeaseHeldError", err)
	}
	if held.Holder.ID != g.Lease.ID || held.Holder.HolderUID != 1000 {
		t.Errorf("conflict names %+v, want lease %s of uid 1000", held.Holder, g.Lease.ID)
	}
	if !g.Lease.Live() || g.Lease.Mode != leasecore.ModeToken || g.Token == "" ||
		!g.Lease.ExpiresAt.Equal(g.Lease.HeartbeatAt.Add(leaseDuration)) {
		t.Errorf("granted lease = %+v", g.Lease)
	}
}

func testTokenMismatch(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx := context.Background()
	g := e.reserve("x", 1000)
	e.clock.Advance(time.Second)
	_, err := e.s.Renew(ctx, g.Lease.ID, leasecore.NewToken(), nil)
	wantErr(t, "Renew with a wrong token", err, leasecore.ErrTokenMismatch)
	_, err = e.s.Release(ctx, g.Lease.ID, leasecore.NewToken(), leasecore.StatusComplete, nil)
	wantErr(t, "Release with a wrong token", err, leasecore.ErrTokenMismatch)
	l, err := e.s.Live(ctx, "x")
	if err != nil || !l.HeartbeatAt.Equal(g.Lease.HeartbeatAt) {
		t.Fatalf("lease after refused calls = %+v, %v; want it unchanged", l, err)
	}
	l, err = e.s.Renew(ctx, g.Lease.ID, g.Token, nil)
	if err != nil || !l.HeartbeatAt.Equal(e.clock.Now().UTC()) {
		t.Fatalf("Renew with the token = %+v, %v", l, err)
	}
}

func testInactive(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx := context.Background()
	g := e.reserve("x", 1000)
	if _, err := e.s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	_, err := e.s.Renew(ctx, g.Lease.ID, g.Token, nil)
	wantErr(t, "Renew of an ended lease", err, leasecore.ErrInactive)
	_, err = e.s.Bind(ctx, g.Lease.ID, 1)
	wantErr(t, "Bind of an ended lease", err, leasecore.ErrInactive)
	_, err = e.s.End(ctx, g.Lease.ID, leasecore.StatusComplete)
	wantErr(t, "second End", err, leasecore.ErrInactive)
	_, err = e.s.Load(ctx, leasecore.NewLeaseID())
	wantErr(t, "Load of an unknown id", err, leasecore.ErrNotFound)
	_, err = e.s.Load(ctx, "not-a-lease")
	wantErr(t, "Load of a malformed id", err, leasecore.ErrInvalidID)
}

func testExpiry(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx := context.Background()
	feed := e.s.Watch(ctx)
	g := e.reserve("x", 1000)
	e.clock.Advance(leaseDuration - time.Second)
	if _, err := e.s.Live(ctx, "x"); err != nil {
		t.Fatalf("Live before the TTL: %v", err)
	}
	e.clock.Advance(2 * time.Second)
	_, err := e.s.Live(ctx, "x")
	wantErr(t, "Live after the TTL", err, leasecore.ErrNotFound)
	ended := e.awaitEnd(feed, g.Lease.ID)
	if ended.Status != leasecore.StatusAbandoned || ended.CompletedAt.IsZero() {
		t.Errorf("expired lease ended as %+v, want abandoned", ended)
	}
	_, err = e.s.Renew(ctx, g.Lease.ID, g.Token, nil)
	wantErr(t, "Renew after expiry", err, leasecore.ErrInactive)
	hist, err := e.s.History(ctx, "x")
	if err != nil || len(hist) != 1 || hist[0].ID != g.Lease.ID || hist[0].Status != leasecore.StatusAbandoned {
		t.Fatalf("History = %+v, %v", hist, err)
	}
	e.reserve("x", 1001)
}

// Reads never end a lease: a dead lease is shown ended, and only the store
// itself ends it.
func testReadsArePure(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx := context.Background()
	g := e.reserve("x", 1000)
	e.clock.Advance(leaseDuration + time.Second)
	l, err := e.s.Load(ctx, g.Lease.ID)
	if err != nil || l.Live() {
		t.Fatalf("Load of an expired lease = %+v, %v; want it shown ended", l, err)
	}
	list, err := e.s.List(ctx)
	if err != nil || len(list) != 0 {
		t.Fatalf("List = %+v, %v; want no live lease", list, err)
	}
	_, leases, err := e.s.ListDir(ctx, "")
	if err != nil || len(leases) != 0 {
		t.Fatalf("ListDir = %+v, %v; want no live lease", leases, err)
	}
}

func testGenerations(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx := context.Background()
	var last uint64
	for i, r := range []string{"a", "b", "a", "c", "a"} {
		g := e.reserve(r, 1000)
		if g.Lease.Generation <= last {
			t.Fatalf("reservation %d has generation %d after %d", i, g.Lease.Generation, last)
		}
		last = g.Lease.Generation
		if _, err := e.s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
			t.Fatal(err)
		}
	}
}

// wantEvent is an event a test expects on a change feed.
type wantEvent struct {
	kind   leasecore.EventKind
	change leasecore.Change
	id     string
}

func testEvents(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	feed := e.s.Watch(ctx)
	ends := e.s.Watch(ctx, leasecore.EventEnded)
	a, b, c := e.reserve("a", 1000), e.reserve("b", 1000), e.reserve("c", 1000)
	for _, g := range []leasecore.Grant{a, b, c} {
		select {
		case ev := <-feed:
			if ev.Kind != leasecore.EventReserved || ev.Change != leasecore.ChangeReserved || ev.Lease.ID != g.Lease.ID {
				t.Fatalf("event %v %s, want reserved %s", ev.Kind, ev.Lease.ID, g.Lease.ID)
			}
		case <-time.After(guard):
			t.Fatal("no reserved event")
		}
	}
	if _, err := e.s.Renew(ctx, b.Lease.ID, b.Token, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.RequestTakeover(ctx, b.Lease.ID, leasecore.TakeoverRequest{By: "uid 1001"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Bind(ctx, a.Lease.ID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.End(ctx, a.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Release(ctx, b.Lease.ID, b.Token, leasecore.StatusAbandoned, nil); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(leaseDuration + time.Second) // c expires; the store ends it by itself
	want := []wantEvent{
		{leasecore.EventChanged, leasecore.ChangeRenewed, b.Lease.ID},
		{leasecore.EventChanged, leasecore.ChangeTakeoverRequested, b.Lease.ID},
		{leasecore.EventChanged, leasecore.ChangeBound, a.Lease.ID},
		{leasecore.EventEnded, leasecore.ChangeReleased, a.Lease.ID},
		{leasecore.EventEnded, leasecore.ChangeReleased, b.Lease.ID},
		{leasecore.EventEnded, leasecore.ChangeExpired, c.Lease.ID},
	}
	// Events come in order for each lease; those of different leases may
	// interleave (a store that follows names one by one, [leasecore.Store.Watch]).
	expect := func(what string, ch <-chan leasecore.Event, want []wantEvent) {
		t.Helper()
		left := slices.Clone(want)
		for range want {
			select {
			case ev := <-ch:
				i := slices.IndexFunc(left, func(w wantEvent) bool { return w.id == ev.Lease.ID })
				if i < 0 || left[i].kind != ev.Kind || left[i].change != ev.Change {
					t.Fatalf("%s: event %v (change %d) %s, want the next of that lease in %v", what, ev.Kind, ev.Change, ev.Lease.ID, left)
				}
				left = slices.Delete(left, i, i+1)
			case <-time.After(guard):
				t.Fatalf("%s: no event for %v", what, left)
			}
		}
	}
	expect("watch of every kind", feed, want)
	// A watch of the ends alone gets the same ends in the same order, and
	// nothing of the reservations and changes before them.
	expect("watch of the ends", ends, want[3:])
	cancel()
	for range feed { // closed once ctx is done
	}
	for ev := range ends {
		t.Errorf("watch of the ends: a further event %v %s", ev.Kind, ev.Lease.ID)
	}
}

func testReleaseAnnotations(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx := context.Background()
	g := e.reserve("x", 1000)
	l, err := e.s.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusComplete,
		leasecore.Annotations{"anchor_state": "deadbeef", "client": "ci"})
	if err != nil || l.Status != leasecore.StatusComplete || l.AnchorState != "deadbeef" || l.Client != "ci" {
		t.Fatalf("Release = %+v, %v", l, err)
	}
	_, err = e.s.Renew(ctx, e.reserve("y", 1000).Lease.ID, "hwl_x", leasecore.Annotations{"colour": "red"})
	if err == nil {
		t.Fatal("Renew with an unknown annotation and a wrong token succeeded")
	}
	g = e.reserve("z", 1000)
	_, err = e.s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{"colour": "red"})
	wantErr(t, "Renew with an unknown annotation", err, leasecore.ErrInvalidArgument)
}

func testBind(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx := context.Background()
	g := e.reserve("x", 1000)
	l, err := e.s.Bind(ctx, g.Lease.ID, 77)
	if err != nil || l.Mode != leasecore.ModeHandle || !l.ExpiresAt.IsZero() || l.HolderPID != 77 {
		t.Fatalf("Bind = %+v, %v", l, err)
	}
	e.clock.Advance(time.Hour)
	if l, err := e.s.Live(ctx, "x"); err != nil || l.ID != g.Lease.ID {
		t.Fatalf("handle lease after an hour: %+v, %v; handle leases never expire by time", l, err)
	}
	h, err := e.s.Reserve(ctx, leasecore.Draft{Resource: "h", Mode: leasecore.ModeHandle, HolderUID: 1})
	if err != nil || h.Lease.Mode != leasecore.ModeHandle || !h.Lease.ExpiresAt.IsZero() {
		t.Fatalf("Reserve of a handle lease = %+v, %v", h.Lease, err)
	}
}

// testNote records and replaces a holder's note on a live lease, shows it
// in the lease and, once ended, in its record, and refuses one over MaxNote
// bytes and one on an ended lease (docs/PROTOCOL.md §4.2, "Notes").
func testNote(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx := context.Background()
	g := e.reserve("x", 1000)
	if _, err := e.s.Bind(ctx, g.Lease.ID, 77); err != nil {
		t.Fatal(err)
	}
	l, err := e.s.Note(ctx, g.Lease.ID, "locked by 77")
	if err != nil || l.Note != "locked by 77" {
		t.Fatalf("Note = %+v, %v", l, err)
	}
	if l, err := e.s.Live(ctx, "x"); err != nil || l.Note != "locked by 77" {
		t.Fatalf("Live after Note = %q, %v", l.Note, err)
	}
	_, err = e.s.Note(ctx, g.Lease.ID, strings.Repeat("n", leasecore.MaxNote+1))
	wantErr(t, "a note over MaxNote bytes", err, leasecore.ErrInvalidArgument)
	if l, err := e.s.Note(ctx, g.Lease.ID, "second"); err != nil || l.Note != "second" {
		t.Fatalf("Note replacing the first = %+v, %v", l, err)
	}
	if _, err := e.s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	_, err = e.s.Note(ctx, g.Lease.ID, "late")
	wantErr(t, "a note on an ended lease", err, leasecore.ErrInactive)
	if l, err := e.s.Load(ctx, g.Lease.ID); err != nil || l.Note != "second" {
		t.Fatalf("the ended lease keeps its note: %q, %v", l.Note, err)
	}
}

func testQuota(t *testing.T, open Factory) {
	e := newEnv(t, open, 2)
	ctx := context.Background()
	e.reserve("a", 1000)
	e.reserve("b", 1000)
	_, err := e.s.Reserve(ctx, leasecore.Draft{Resource: "c", HolderUID: 1000})
	wantErr(t, "third Reserve of one uid", err, leasecore.ErrQuota)
	e.reserve("c", 1001)
	e.clock.Advance(leaseDuration + time.Second) // dead leases do not count
	e.reserve("d", 1000)
}

func testNamespaces(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx := context.Background()
	if _, err := e.s.Mkdir(ctx, "ns", 1000, 1000); err != nil {
		t.Fatal(err)
	}
	_, err := e.s.Mkdir(ctx, "ns", 1000, 1000)
	wantErr(t, "second Mkdir", err, leasecore.ErrExists)
	_, err = e.s.Reserve(ctx, leasecore.Draft{Resource: "missing/x"})
	wantErr(t, "Reserve in a missing namespace", err, leasecore.ErrNoNamespace)
	_, err = e.s.Reserve(ctx, leasecore.Draft{Resource: "ns"})
	wantErr(t, "Reserve of a namespace name", err, leasecore.ErrIsNamespace)
	g := e.reserve("ns/x", 1000)
	nss, leases, err := e.s.ListDir(ctx, "")
	if err != nil || len(nss) != 1 || nss[0].Path != "ns" || len(leases) != 0 {
		t.Fatalf("ListDir(root) = %+v, %+v, %v", nss, leases, err)
	}
	if _, leases, err := e.s.ListDir(ctx, "ns"); err != nil || len(leases) != 1 || leases[0].ID != g.Lease.ID {
		t.Fatalf("ListDir(ns) = %+v, %v", leases, err)
	}
	wantErr(t, "Rmdir of a namespace with a live lease", e.s.Rmdir(ctx, "ns"), leasecore.ErrNotEmpty)
	if _, err := e.s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Rmdir(ctx, "ns"); err != nil {
		t.Fatalf("Rmdir of an empty namespace: %v", err)
	}
	_, err = e.s.Namespace(ctx, "ns")
	wantErr(t, "Namespace after Rmdir", err, leasecore.ErrNotFound)
}

// waitWaiters waits until the live lease on resource shows n waiters.
func (e *env) waitWaiters(resource string, n int) {
	e.t.Helper()
	deadline := time.Now().Add(guard)
	for {
		l, err := e.s.Live(context.Background(), resource)
		if err == nil && l.Waiters == n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("live lease on %s: %+v, %v; want %d waiters", resource, l, err, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func testAcquireFIFO(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	ctx := context.Background()
	holder := e.reserve("x", 1000)
	type result struct {
		who int
		g   leasecore.Grant
		err error
	}
	results := make(chan result, 3)
	for i := range 3 {
		go func() {
			g, err := e.s.Acquire(ctx, leasecore.Draft{Resource: "x", Mode: leasecore.ModeHandle, HolderUID: uint32(2000 + i)})
			results <- result{i, g, err}
		}()
		e.waitWaiters("x", i+1) // arrival order is i
	}
	prev := holder.Lease.ID
	for want := range 3 {
		if _, err := e.s.End(ctx, prev, leasecore.StatusComplete); err != nil {
			t.Fatal(err)
		}
		var r result
		select {
		case r = <-results:
		case <-time.After(guard):
			t.Fatalf("no waiter granted within %v after the end of %s", guard, prev)
		}
		if r.err != nil || r.who != want {
			t.Fatalf("granted waiter %d (%v), want waiter %d: first come first served", r.who, r.err, want)
		}
		if r.g.Lease.Waiters != 2-want {
			t.Errorf("waiter %d granted with %d waiters behind, want %d", want, r.g.Lease.Waiters, 2-want)
		}
		prev = r.g.Lease.ID
	}
}

func testAcquireCancel(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	holder := e.reserve("x", 1000)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.s.Acquire(ctx, leasecore.Draft{Resource: "x", HolderUID: 2000})
		done <- err
	}()
	e.waitWaiters("x", 1)
	cancel()
	select {
	case err := <-done:
		wantErr(t, "cancelled Acquire", err, context.Canceled)
	case <-time.After(guard):
		t.Fatal("cancelled Acquire did not return")
	}
	e.waitWaiters("x", 0)
	l, err := e.s.Live(context.Background(), "x")
	if err != nil || l.ID != holder.Lease.ID {
		t.Fatalf("after a cancelled Acquire the lease is %+v, %v; want the holder's", l, err)
	}
	// A free name is acquired at once.
	if g, err := e.s.Acquire(context.Background(), leasecore.Draft{Resource: "free", HolderUID: 1}); err != nil || !g.Lease.Live() {
		t.Fatalf("Acquire of a free name = %+v, %v", g.Lease, err)
	}
}

func testAcquireExpiry(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	holder := e.reserve("x", 1000)
	done := make(chan leasecore.Grant, 1)
	go func() {
		g, err := e.s.Acquire(context.Background(), leasecore.Draft{Resource: "x", Mode: leasecore.ModeHandle, HolderUID: 2000})
		if err != nil {
			t.Errorf("Acquire: %v", err)
		}
		done <- g
	}()
	e.waitWaiters("x", 1)
	e.clock.Advance(leaseDuration + time.Second)
	select {
	case g := <-done:
		if g.Lease.ID == holder.Lease.ID || g.Lease.HolderUID != 2000 {
			t.Fatalf("granted %+v", g.Lease)
		}
	case <-time.After(guard):
		t.Fatal("the waiter was not granted after the holder's lease expired")
	}
}

func testClose(t *testing.T, open Factory) {
	e := newEnv(t, open, 0)
	feed := e.s.Watch(context.Background())
	e.reserve("x", 1000)
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := e.s.Reserve(context.Background(), leasecore.Draft{Resource: "y"})
	wantErr(t, "Reserve after Close", err, leasecore.ErrClosed)
	_, err = e.s.Live(context.Background(), "x")
	wantErr(t, "Live after Close", err, leasecore.ErrClosed)
	deadline := time.After(guard)
	for {
		select {
		case _, ok := <-feed:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the feed was not closed with the store")
		}
	}
}
