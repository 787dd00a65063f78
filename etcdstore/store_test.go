package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefs/leasefs/etcdstore"
	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/internal/syncbuf"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/clocktest"
	"github.com/leasefs/leasefs/leasecore/storetest"
)

var prefixes atomic.Int64

// open opens a store under a fresh prefix of srv.
func open(t testing.TB, srv *etcdtest.Server, opts etcdstore.Options) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.Open(context.Background(), []string{srv.Endpoint()},
		fmt.Sprintf("/test/%d", prefixes.Add(1)), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestContract(t *testing.T) {
	srv := etcdtest.Start(t)
	storetest.Run(t, func(t *testing.T, opts leasecore.Options) leasecore.Store {
		return open(t, srv, etcdstore.Options{Options: opts})
	})
}

// openAt opens a store on prefix of srv.
func openAt(t *testing.T, srv *etcdtest.Server, prefix string, opts etcdstore.Options) *etcdstore.Store {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := etcdstore.Open(context.Background(), []string{srv.Endpoint()}, prefix, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// awaitEvent waits (at most guard) on feed for an event of lease id
// matching kind.
func awaitEvent(t *testing.T, feed <-chan leasecore.Event, id string, kind leasecore.EventKind) leasecore.Event {
	t.Helper()
	timeout := time.After(guard)
	for {
		select {
		case ev, ok := <-feed:
			if !ok {
				t.Fatalf("feed closed before a %v event of %s", kind, id)
			}
			if ev.Lease.ID == id && ev.Kind == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %v event of %s within %v", kind, id, guard)
		}
	}
}

const guard = 20 * time.Second

// Two stores on one prefix are two mounts of one shared namespace: what
// one does, the other sees at once, and on its feed once it follows the
// name.
func TestTwoMountsShareLeases(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	a := openAt(t, srv, "/shared", etcdstore.Options{DaemonID: "a"})
	b := openAt(t, srv, "/shared", etcdstore.Options{DaemonID: "b"})
	feedB := b.Watch(ctx)
	g, err := a.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := b.Live(ctx, "x"); err != nil || l.ID != g.Lease.ID || l.Generation != g.Lease.Generation {
		t.Fatalf("B sees %+v, %v; want A's lease %s", l, err, g.Lease.ID)
	}
	_, err = b.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1001})
	if !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("Reserve through B = %v, want ErrHeld", err)
	}
	// B follows x from its lookup on (docs/PROTOCOL.md §8a, "Changes
	// from other mounts"): its feed shows what follows, not A's
	// reservation, which came before.
	// B renews with the token A handed out: the token is the credential.
	if _, err := b.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
		t.Fatalf("Renew through B: %v", err)
	}
	awaitEvent(t, feedB, g.Lease.ID, leasecore.EventChanged)

	// A waiter on B is served when A releases.
	got := make(chan leasecore.Grant, 1)
	go func() {
		g, err := b.Acquire(ctx, leasecore.Draft{Resource: "x", HolderUID: 1001, Mode: leasecore.ModeHandle})
		if err != nil {
			t.Errorf("Acquire through B: %v", err)
		}
		got <- g
	}()
	deadline := time.Now().Add(guard)
	for {
		l, err := a.Live(ctx, "x")
		if err == nil && l.Waiters == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A never saw B's waiter: %+v, %v", l, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ended, err := a.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusComplete, nil)
	if err != nil || ended.Status != leasecore.StatusComplete {
		t.Fatalf("Release through A = %+v, %v", ended, err)
	}
	if ev := awaitEvent(t, feedB, g.Lease.ID, leasecore.EventEnded); ev.Change != leasecore.ChangeReleased {
		t.Errorf("B's feed reports the release as change %d", ev.Change)
	}
	var h leasecore.Grant
	select {
	case h = <-got:
	case <-time.After(guard):
		t.Fatal("B's waiter was not granted after A released")
	}
	if h.Lease.Generation <= g.Lease.Generation || h.Lease.HolderUID != 1001 {
		t.Fatalf("B's grant %+v after generation %d", h.Lease, g.Lease.Generation)
	}
	if hist, err := b.History(ctx, "x"); err != nil || len(hist) != 1 || hist[0].ID != g.Lease.ID {
		t.Fatalf("History through B = %+v, %v", hist, err)
	}

	// A daemon that starts again ends only its own handle leases.
	a2 := openAt(t, srv, "/shared", etcdstore.Options{DaemonID: "a"})
	if l, err := a2.Live(ctx, "x"); err != nil || l.ID != h.Lease.ID {
		t.Fatalf("a restarted daemon ended another daemon's handle lease: %+v, %v", l, err)
	}
	// A handle lease outlives its daemon while its open file lives
	// (docs/PROTOCOL.md §2): closing B ends nothing, and B started again
	// keeps the lease alive if a process still holds the open file, and
	// ends it otherwise.
	b.Close()
	if l, err := a2.Live(ctx, "x"); err != nil || l.ID != h.Lease.ID {
		t.Fatalf("B's handle lease after B closed: %+v, %v; want it live until its TTL", l, err)
	}
	b2 := openAt(t, srv, "/shared", etcdstore.Options{DaemonID: "b", Options: leasecore.Options{
		HandleHolders: func(l leasecore.Lease) []int { return []int{4242} },
	}})
	l, err := b2.Live(ctx, "x")
	if err != nil || l.ID != h.Lease.ID || l.Daemon != leasecore.DaemonPrevious || l.HolderPIDs != "4242" {
		t.Fatalf("B restarted with the open file held: %+v, %v; want %s live, daemon %q, holder_pids 4242", l, err, h.Lease.ID, leasecore.DaemonPrevious)
	}
	if !b2.OwnsHandle(h.Lease.ID) {
		t.Fatal("B restarted with the open file held does not keep the lease alive")
	}
	b2.Close()
	b3 := openAt(t, srv, "/shared", etcdstore.Options{DaemonID: "b"})
	if _, err := b3.Live(ctx, "x"); !errors.Is(err, leasecore.ErrNotFound) {
		t.Fatalf("B restarted with the open file gone: %v, want the lease ended", err)
	}
	if _, err := a2.Live(ctx, "x"); !errors.Is(err, leasecore.ErrNotFound) {
		t.Fatalf("A after B ended its lease: %v, want it ended", err)
	}
}

// When the cluster becomes unreachable (the proxy between the store and
// etcd is cut: connections reset, new ones refused, as when etcd's machine
// dies), a handle lease ends for its store
// once its keep-alive has failed past the TTL, reported as expired, and
// every call fails with a *PersistError (EIO) within a bounded time.
func TestConnectivityLoss(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	const ttl, callTimeout = 2 * time.Second, time.Second
	var opts etcdstore.Options
	opts.LeaseDuration, opts.CallTimeout = ttl, callTimeout
	opts.Logger = slog.New(slog.DiscardHandler)
	proxy := etcdtest.NewProxy(t, srv.Endpoint())
	s, err := etcdstore.Open(ctx, []string{proxy.Endpoint()}, "/loss", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// other reaches the cluster directly, as another machine's mount.
	other := openAt(t, srv, "/loss", opts)
	feed := s.Watch(ctx)
	h, err := s.Reserve(ctx, leasecore.Draft{Resource: "h", Mode: leasecore.ModeHandle, HolderUID: 1})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := s.Reserve(ctx, leasecore.Draft{Resource: "t", HolderUID: 1})
	if err != nil {
		t.Fatal(err)
	}
	awaitEvent(t, feed, tok.Lease.ID, leasecore.EventReserved)
	stopped := time.Now()
	proxy.Cut()

	ev := awaitEvent(t, feed, h.Lease.ID, leasecore.EventEnded)
	lostAfter := time.Since(stopped)
	if ev.Change != leasecore.ChangeExpired || ev.Lease.Status != leasecore.StatusAbandoned {
		t.Fatalf("end of the handle lease reported as %+v (change %d), want expired", ev.Lease, ev.Change)
	}
	t.Logf("handle lease ended %v after the cluster went away (TTL %v)", lostAfter.Round(10*time.Millisecond), ttl)
	// The local end comes first (docs/PROTOCOL.md §8a): the cluster still
	// holds the lease, so no other mount can have it yet.
	if l, err := other.Live(ctx, "h"); err != nil || l.ID != h.Lease.ID {
		t.Errorf("Live on another mount when the cut-off store ended its handle lease = %+v, %v; want the lease still held", l, err)
	}
	// Reads of it through the cut-off store answer from what it knows.
	if l, err := s.Load(ctx, h.Lease.ID); err != nil || l.Status != leasecore.StatusAbandoned {
		t.Errorf("Load of the locally ended handle lease with the cluster gone = %+v, %v; want it abandoned", l, err)
	}
	// The client notices a missed keep-alive within a second of the TTL.
	if limit := ttl + 5*time.Second; lostAfter > limit {
		t.Errorf("the handle lease ended %v after the loss, want within TTL + margin (%v)", lostAfter, limit)
	}
	if _, err := s.End(ctx, h.Lease.ID, leasecore.StatusComplete); !errors.Is(err, leasecore.ErrInactive) {
		t.Errorf("End of the lost handle lease = %v, want ErrInactive (ESTALE)", err)
	}

	calls := map[string]func() error{
		"Live": func() error { _, err := s.Live(ctx, "t"); return err },
		"Renew": func() error {
			_, err := s.Renew(ctx, tok.Lease.ID, tok.Token, nil)
			return err
		},
		"Reserve": func() error {
			_, err := s.Reserve(ctx, leasecore.Draft{Resource: "new", HolderUID: 1})
			return err
		},
		"List": func() error { _, err := s.List(ctx); return err },
	}
	for name, call := range calls {
		began := time.Now()
		err := call()
		took := time.Since(began)
		var pe *leasecore.PersistError
		if !errors.As(err, &pe) {
			t.Errorf("%s with the cluster gone = %v, want a *PersistError (EIO)", name, err)
		}
		if took > guard {
			t.Errorf("%s took %v with a call timeout of %v", name, took, callTimeout)
		}
		t.Logf("%s failed after %v: %v", name, took.Round(10*time.Millisecond), err)
	}

	// Back on the cluster, the name is free and the lease is recorded as
	// abandoned. (Here etcd itself expired the key, since only the path
	// to it was cut; the store's own removal of a lost lease's key, for an
	// etcd lease the cluster kept alive, is not exercised.)
	proxy.Resume(t)
	deadline := time.Now().Add(guard)
	for {
		_, err := s.Live(ctx, "h")
		if errors.Is(err, leasecore.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Live of the lost handle lease after the cluster came back: %v, want ErrNotFound", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if l, err := s.Load(ctx, h.Lease.ID); err != nil || l.Status != leasecore.StatusAbandoned {
		t.Fatalf("Load of the lost handle lease = %+v, %v; want it abandoned", l, err)
	}
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "h", HolderUID: 2}); err != nil {
		t.Fatalf("Reserve of the freed name: %v", err)
	}
}

// Ended records beyond HistoryKeep are pruned, oldest first, and pruning
// never lowers the generation.
func TestHistoryPruned(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	var opts etcdstore.Options
	opts.HistoryKeep = 3
	s := openAt(t, srv, "/prune", opts)
	var ids []string
	var last uint64
	for range 6 {
		g, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1})
		if err != nil {
			t.Fatal(err)
		}
		if g.Lease.Generation <= last {
			t.Fatalf("generation %d after %d", g.Lease.Generation, last)
		}
		last = g.Lease.Generation
		if _, err := s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, g.Lease.ID)
	}
	deadline := time.Now().Add(guard)
	for {
		hist, err := s.History(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(hist) == 3 {
			for i, l := range hist {
				if want := ids[5-i]; l.ID != want {
					t.Fatalf("history[%d] = %s, want %s (newest first, oldest pruned)", i, l.ID, want)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("history still holds %d records, want 3", len(hist))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := s.Load(ctx, ids[0]); !errors.Is(err, leasecore.ErrNotFound) {
		t.Errorf("Load of a pruned lease: %v, want ErrNotFound", err)
	}
}

// A token lease nobody renews is expired by the cluster (its etcd lease's
// TTL), with the store's own clock standing still: the end is published as
// expired, recorded as abandoned, and a late Renew is refused as for an
// ended lease.
func TestExpiryIsTheClusters(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	var opts etcdstore.Options
	opts.LeaseDuration = time.Second
	opts.Clock = clocktest.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	s := openAt(t, srv, "/ttl", opts)
	feed := s.Watch(ctx)
	g, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1})
	if err != nil {
		t.Fatal(err)
	}
	ev := awaitEvent(t, feed, g.Lease.ID, leasecore.EventEnded)
	if ev.Change != leasecore.ChangeExpired || ev.Lease.Status != leasecore.StatusAbandoned {
		t.Fatalf("end by the TTL reported as %+v (change %d), want expired", ev.Lease, ev.Change)
	}
	_, err = s.Renew(ctx, g.Lease.ID, g.Token, nil)
	if !errors.Is(err, leasecore.ErrInactive) {
		t.Fatalf("Renew after the etcd lease expired: %v, want ErrInactive", err)
	}
	deadline := time.Now().Add(guard)
	for {
		hist, err := s.History(ctx, "x")
		if err == nil && len(hist) == 1 && hist[0].ID == g.Lease.ID && hist[0].Status == leasecore.StatusAbandoned {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("History = %+v, %v; want the expired lease, abandoned", hist, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// OnCommit is called once for every call whose transaction changed the
// cluster — reserve, renew, release, mkdir, rmdir — and never for reads or
// refusals.
func TestOnCommitCountsChanges(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	var commits atomic.Int64
	s := openAt(t, srv, "/commits", etcdstore.Options{Options: leasecore.Options{
		OnCommit: func(d time.Duration) {
			if d < 0 {
				t.Errorf("OnCommit(%v): negative", d)
			}
			commits.Add(1)
		}}})
	step := func(what string, want int64) {
		t.Helper()
		if got := commits.Load(); got != want {
			t.Errorf("after %s: %d commits, want %d", what, got, want)
		}
	}
	g, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	step("reserve", 1)
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1001}); !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("second Reserve = %v, want ErrHeld", err)
	}
	if _, err := s.Live(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(ctx, g.Lease.ID, "hwl_wrong", nil); !errors.Is(err, leasecore.ErrTokenMismatch) {
		t.Fatalf("Renew with a wrong token = %v, want ErrTokenMismatch", err)
	}
	step("a refused reserve, a read and a refused renew", 1)
	if _, err := s.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
		t.Fatal(err)
	}
	step("renew", 2)
	if _, err := s.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusComplete, nil); err != nil {
		t.Fatal(err)
	}
	step("release", 3)
	if _, err := s.Mkdir(ctx, "ns", 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := s.Rmdir(ctx, "ns"); err != nil {
		t.Fatal(err)
	}
	step("mkdir and rmdir", 5)
}

// A store cut off from its cluster says so in one log line however many
// calls fail, counts every failed call in Health, and says when the
// cluster answers again (docs/PROTOCOL.md §8a).
func TestUnreachableClusterReported(t *testing.T) {
	srv := etcdtest.Start(t)
	proxy := etcdtest.NewProxy(t, srv.Endpoint())
	var logs syncbuf.Buffer
	s, err := etcdstore.Open(context.Background(), []string{proxy.Endpoint()}, "/health", etcdstore.Options{
		Options:     leasecore.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		CallTimeout: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if h := s.Health(); !h.Reachable || h.Failures != 0 {
		t.Fatalf("Health after Open = %+v, want reachable, no failures", h)
	}
	proxy.Cut()
	for i := range 3 {
		if _, err := s.Live(ctx, "x"); err == nil || errors.Is(err, leasecore.ErrNotFound) {
			t.Fatalf("Live %d without the cluster = %v, want a *PersistError", i, err)
		}
	}
	h := s.Health()
	if h.Reachable || h.Failures < 3 || h.Since.IsZero() {
		t.Errorf("Health after 3 failed calls = %+v, want unreachable with at least 3 failures", h)
	}
	if n := strings.Count(logs.String(), "etcd cluster unreachable"); n != 1 {
		t.Errorf("%d unreachable log lines for 3 failed calls, want 1:\n%s", n, logs.String())
	}
	proxy.Resume(t)
	deadline := time.Now().Add(guard)
	for {
		if _, err := s.Live(ctx, "x"); errors.Is(err, leasecore.ErrNotFound) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("Live after the cluster is back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if h := s.Health(); !h.Reachable {
		t.Errorf("Health after a call the cluster answered = %+v, want reachable", h)
	}
	if !strings.Contains(logs.String(), "etcd cluster reachable again") {
		t.Errorf("no log line for the cluster's return:\n%s", logs.String())
	}
}

// Mounts of one cluster may run with different lease durations: a token
// lease expires by the duration of the daemon that reserved it (the TTL of
// its etcd lease), as every mount reports and judges it.
func TestLeaseDurationOfTheReservingDaemon(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	long := openAt(t, srv, "/durations", etcdstore.Options{DaemonID: "long", Options: leasecore.Options{LeaseDuration: time.Hour}})
	clock := clocktest.NewFakeClock(time.Now().UTC())
	short := openAt(t, srv, "/durations", etcdstore.Options{DaemonID: "short",
		Options: leasecore.Options{LeaseDuration: 2 * time.Second, Clock: clock}})
	g, err := long.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	l, err := short.Live(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if want := l.HeartbeatAt.Add(time.Hour); !l.ExpiresAt.Equal(want) {
		t.Errorf("the 2 s mount reports expires_at %v, want the reserving mount's heartbeat + 1h = %v", l.ExpiresAt, want)
	}
	clock.Advance(10 * time.Second) // past the short mount's own duration
	if _, err := short.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1001}); !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("Reserve through the 2 s mount 10 s after the 1 h lease's heartbeat = %v, want ErrHeld", err)
	}
	if l, err := short.Live(ctx, "x"); err != nil || l.ID != g.Lease.ID || !l.Live() {
		t.Errorf("the 1 h lease through the 2 s mount after 10 s: %+v, %v; want it live", l, err)
	}
}

// Each of two stores sharing a prefix owns only the handle leases it bound
// (leasecore.OwnsHandle): what a daemon may end when it stops or hands over.
func TestOwnsHandle(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	a := openAt(t, srv, "/owned", etcdstore.Options{DaemonID: "a"})
	b := openAt(t, srv, "/owned", etcdstore.Options{DaemonID: "b"})
	g, err := a.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if leasecore.OwnsHandle(a, g.Lease) {
		t.Error("a token lease counts as an owned handle lease")
	}
	l, err := a.Bind(ctx, g.Lease.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen, err := b.Load(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !leasecore.OwnsHandle(a, l) || leasecore.OwnsHandle(b, seen) {
		t.Errorf("OwnsHandle: store a %v, store b %v; want true, false", leasecore.OwnsHandle(a, l), leasecore.OwnsHandle(b, seen))
	}
	if _, err := a.End(ctx, l.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if a.OwnsHandle(l.ID) {
		t.Error("store a still owns the handle lease it ended")
	}
}

// A cluster that does not answer at Open is named, with the timeout and
// what to check, not reported as a bare "context deadline exceeded".
func TestOpenUnreachableNamesTheEndpoints(t *testing.T) {
	srv := etcdtest.Start(t)
	proxy := etcdtest.NewProxy(t, srv.Endpoint())
	proxy.Cut()
	_, err := etcdstore.Open(context.Background(), []string{proxy.Endpoint()}, "/open", etcdstore.Options{
		Options:     leasecore.Options{Logger: slog.New(slog.DiscardHandler)},
		CallTimeout: 300 * time.Millisecond,
	})
	if err == nil {
		t.Fatal("Open through a cut proxy succeeded")
	}
	for _, want := range []string{proxy.Endpoint(), "answered within 300ms", "check that etcd runs there"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open error %q does not say %q", err, want)
		}
	}
}

// An election inside the cluster is not an outage: reads refused with
// etcd's "leader changed" are asked again within the call's bound, and no
// "unreachable" line is logged (docs/PROTOCOL.md §8a).
func TestLeaderElectionIsNotAnOutage(t *testing.T) {
	members := etcdtest.StartCluster(t, 3)
	var logs syncbuf.Buffer
	s, err := etcdstore.Open(context.Background(), strings.Split(etcdtest.Endpoints(members), ","), "/elect", etcdstore.Options{
		Options: leasecore.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "held", HolderUID: 1}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var reads, failed atomic.Int64
	var firstErr atomic.Value
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, l, err := s.ReadName(ctx, "held")
			if err == nil && l == nil {
				err = errors.New("the held lease is not there")
			}
			if err == nil {
				_, err = s.List(ctx)
			}
			reads.Add(1)
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
		}
	}()
	const transfers = 5
	for range transfers {
		before := reads.Load()
		etcdtest.MoveLeader(t, members)
		// Let reads run on the new leader before the next transfer.
		for reads.Load() < before+20 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	close(stop)
	<-done
	t.Logf("%d reads across %d leader transfers, %d failed", reads.Load(), transfers, failed.Load())
	if failed.Load() > 0 {
		t.Errorf("%d of %d reads failed across %d leader transfers; first: %v", failed.Load(), reads.Load(), transfers, firstErr.Load())
	}
	if strings.Contains(logs.String(), "unreachable") {
		t.Errorf("an election was logged as an outage:\n%s", logs.String())
	}
}

// A bind that the cluster committed while its answer was lost (the call
// fails with its outcome unknown) leaves no handle lease on the daemon's
// session that no open file holds: once the cluster answers again the
// store ends it (docs/PROTOCOL.md §8a, "Elections").
func TestBindOfUnknownOutcomeIsEnded(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	var opts etcdstore.Options
	opts.LeaseDuration, opts.CallTimeout = 30*time.Second, time.Second
	opts.Logger = slog.New(slog.DiscardHandler)
	proxy := etcdtest.NewProxy(t, srv.Endpoint())
	s, err := etcdstore.Open(ctx, []string{proxy.Endpoint()}, "/unbound", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	other := openAt(t, srv, "/unbound", opts)
	// A handle lease first, so that the bind needs no new session.
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "h", Mode: leasecore.ModeHandle, HolderUID: 1}); err != nil {
		t.Fatal(err)
	}
	g, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1})
	if err != nil {
		t.Fatal(err)
	}
	proxy.DropReplies(true)
	if _, err := s.Bind(ctx, g.Lease.ID, os.Getpid()); !errors.Is(err, leasecore.ErrOutcomeUnknown) {
		t.Fatalf("Bind with its answer lost = %v, want ErrOutcomeUnknown", err)
	}
	if l, err := other.Live(ctx, "x"); err != nil || l.ID != g.Lease.ID || l.Mode != leasecore.ModeHandle {
		t.Fatalf("Live(x) on another store after the lost answer = %+v, %v; want the bind committed (a handle lease)", l, err)
	}
	// New connections carry the answers again.
	proxy.Cut()
	proxy.DropReplies(false)
	proxy.Resume(t)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l, err := other.Live(ctx, "x")
		if errors.Is(err, leasecore.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Live(x) 20 s after the cluster answers again = %+v, %v; want the bound lease no open file holds ended", l, err)
		}
	}
	if l, err := other.Load(ctx, g.Lease.ID); err != nil || l.Status != leasecore.StatusAbandoned {
		t.Fatalf("the lease after the store ended it = %+v, %v; want abandoned", l, err)
	}
	if l, err := other.Live(ctx, "h"); err != nil || l.Mode != leasecore.ModeHandle {
		t.Fatalf("the other handle lease after the outage = %+v, %v; want it still held", l, err)
	}
}
