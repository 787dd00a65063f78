package etcdstore_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/etcdstore"
	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/leasecore"
)

// awaitJeopardy polls until handle lease id of s is in jeopardy and returns
// the channel that closes when it leaves it.
func awaitJeopardy(t *testing.T, s *etcdstore.Store, id string) <-chan struct{} {
	t.Helper()
	for end := time.Now().Add(guard); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if ch := s.Jeopardy(id); ch != nil {
			return ch
		}
	}
	t.Fatalf("handle lease %s never entered jeopardy", id)
	return nil
}

// A handle lease whose keep-alive is not confirmed by its local deadline is
// in jeopardy, not ended (docs/PROTOCOL.md §8a, "Elections and jeopardy"):
// the cluster answering within the grace period keeps it, with nothing
// published; the grace period passing ends it, while the cluster (whose
// TTL for it is the lease duration + the grace period) still holds it for
// every other mount.
func TestHandleLeaseJeopardy(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	const duration, grace = 2 * time.Second, 5 * time.Second
	var opts etcdstore.Options
	opts.LeaseDuration, opts.Grace, opts.CallTimeout = duration, grace, time.Second
	opts.Logger = slog.New(slog.DiscardHandler)
	var mu sync.Mutex
	var reports []int
	withReports := opts
	withReports.OnJeopardy = func(n int) {
		mu.Lock()
		reports = append(reports, n)
		mu.Unlock()
	}
	proxy := etcdtest.NewProxy(t, srv.Endpoint())
	s, err := etcdstore.Open(ctx, []string{proxy.Endpoint()}, "/jeopardy", withReports)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	other := openAt(t, srv, "/jeopardy", opts)
	feed := s.Watch(ctx)
	g, err := s.Reserve(ctx, leasecore.Draft{Resource: "h", Mode: leasecore.ModeHandle, HolderUID: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := g.Lease.ID

	// The cluster's TTL of the handle session is the lease duration + the
	// grace period.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "/jeopardy/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var ttls []int64
	for _, kv := range resp.Kvs {
		if kv.Lease != 0 {
			ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
			if err != nil {
				t.Fatal(err)
			}
			ttls = append(ttls, ttl.GrantedTTL)
		}
	}
	if want := int64((duration + grace) / time.Second); len(ttls) == 0 || slices.ContainsFunc(ttls, func(v int64) bool { return v != want }) {
		t.Errorf("granted TTLs of the etcd leases under the prefix = %v, want %d s (lease duration + grace)", ttls, want)
	}

	// Cut off, then back within the grace period: kept.
	cut := time.Now()
	proxy.Cut()
	ch := awaitJeopardy(t, s, id)
	t.Logf("in jeopardy %v after the cut", time.Since(cut).Round(time.Millisecond))
	if h := s.Health(); h.InJeopardy != 1 || h.JeopardyTotal != 1 {
		t.Errorf("Health in jeopardy = %+v, want 1 in jeopardy, 1 in all", h)
	}
	if l, err := s.Load(ctx, id); err != nil || !l.Live() {
		t.Errorf("Load of the lease in jeopardy = %+v, %v; want it live", l, err)
	}
	proxy.Resume(t)
	select {
	case <-ch:
	case <-time.After(guard):
		t.Fatal("the lease did not leave jeopardy after the cluster came back")
	}
	t.Logf("out of jeopardy %v after the cut", time.Since(cut).Round(time.Millisecond))
	if l, err := s.Load(ctx, id); err != nil || !l.Live() || l.Generation != g.Lease.Generation {
		t.Errorf("Load after jeopardy = %+v, %v; want the same live lease", l, err)
	}
	if s.Jeopardy(id) != nil {
		t.Error("Jeopardy after a confirmed keep-alive is not nil")
	}
	if h := s.Health(); h.InJeopardy != 0 || h.JeopardyTotal != 1 || h.JeopardySaved != 1 {
		t.Errorf("Health after jeopardy = %+v, want 0 in jeopardy, 1 in all, 1 saved", h)
	}
	for drained := false; !drained; {
		select {
		case ev := <-feed:
			if ev.Lease.ID == id && ev.Kind == leasecore.EventEnded {
				t.Fatalf("the lease kept through jeopardy was published as ended: %+v", ev)
			}
		default:
			drained = true
		}
	}

	// Cut off for longer than the grace period: ended by this store while
	// the cluster still holds it for everyone else.
	proxy.Cut()
	ch = awaitJeopardy(t, s, id)
	awaitEvent(t, feed, id, leasecore.EventEnded)
	select {
	case <-ch:
	default:
		t.Error("the jeopardy channel of an ended lease is still open")
	}
	if l, err := other.Live(ctx, "h"); err != nil || l.ID != id {
		t.Errorf("Live on another mount when the cut-off store ended its handle lease = %+v, %v; want the lease still held", l, err)
	}
	if l, err := s.Load(ctx, id); err != nil || l.Live() {
		t.Errorf("Load of the ended lease = %+v, %v; want it ended", l, err)
	}
	if h := s.Health(); h.InJeopardy != 0 || h.JeopardyTotal != 2 || h.JeopardySaved != 1 {
		t.Errorf("Health after the end = %+v, want 0 in jeopardy, 2 in all, 1 saved", h)
	}
	mu.Lock()
	got := slices.Clone(reports)
	mu.Unlock()
	if !slices.Equal(got, []int{1, 0, 1, 0}) {
		t.Errorf("OnJeopardy reports %v, want [1 0 1 0]", got)
	}
}

// Without a grace period a handle lease ends at its local deadline, as
// before jeopardy existed, and the cluster's TTL is the lease duration.
func TestNoGraceNoJeopardy(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	var opts etcdstore.Options
	opts.LeaseDuration, opts.CallTimeout = 2*time.Second, time.Second
	opts.Logger = slog.New(slog.DiscardHandler)
	proxy := etcdtest.NewProxy(t, srv.Endpoint())
	s, err := etcdstore.Open(ctx, []string{proxy.Endpoint()}, "/nograce", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	feed := s.Watch(ctx)
	g, err := s.Reserve(ctx, leasecore.Draft{Resource: "h", Mode: leasecore.ModeHandle, HolderUID: 1})
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	timeout := time.After(guard)
	for {
		if s.Jeopardy(g.Lease.ID) != nil {
			t.Fatal("a handle lease of a store without a grace period entered jeopardy")
		}
		select {
		case ev := <-feed:
			if ev.Lease.ID == g.Lease.ID && ev.Kind == leasecore.EventEnded {
				if h := s.Health(); h.JeopardyTotal != 0 {
					t.Errorf("Health = %+v, want no jeopardy", h)
				}
				return
			}
		case <-timeout:
			t.Fatal("the handle lease did not end after the cut")
		case <-time.After(10 * time.Millisecond):
		}
	}
}
