package etcdstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/leasecore"
)

// openStore opens a store of srv on prefix, closed when t ends.
func openStore(t *testing.T, srv *etcdtest.Server, prefix string, opts Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), []string{srv.Endpoint()}, prefix, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestIdleStoreHearsNothing: a store that follows no name (an idle mount)
// hears none of the changes another store makes, holds none of its leases
// in its view, and lets go of a name it looked up once nothing keeps it
// followed (docs/PROTOCOL.md §8a, "Changes from other mounts").
func TestIdleStoreHearsNothing(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	opts := Options{Options: leasecore.Options{LeaseDuration: time.Minute}}
	busy, idle := openStore(t, srv, "/idle", opts), openStore(t, srv, "/idle", opts)
	held := make([]leasecore.Grant, 0, 50)
	for i := range 50 {
		name := fmt.Sprintf("n%d", i)
		g, err := busy.Reserve(ctx, leasecore.Draft{Resource: name, HolderUID: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := busy.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := busy.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
				t.Fatal(err)
			}
		} else {
			held = append(held, g)
		}
	}
	if got := busy.heard.Load(); got == 0 {
		t.Fatal("the busy store heard none of its own changes: the watches do not run")
	}
	idle.mu.Lock()
	heard, follows, live, known := idle.heard.Load(), len(idle.follows), len(idle.live), len(idle.known)
	idle.mu.Unlock()
	if heard != 0 || follows != 0 || live != 0 || known != 0 {
		t.Errorf("the idle store heard %d changes, follows %d names, holds %d leases and knows %d; want none",
			heard, follows, live, known)
	}

	// A lookup follows the name; with nothing keeping it (no lease of
	// its own, no waiter, no kernel), the store lets it go.
	if _, l, err := idle.ReadName(ctx, "n1"); err != nil || l == nil {
		t.Fatalf("idle: ReadName(n1) = %v, %v", l, err)
	}
	if got := idle.Following(); len(got) != 1 || got[0] != "n1" {
		t.Fatalf("idle follows %v after its lookup of n1; want [n1]", got)
	}
	if _, err := busy.End(ctx, held[0].Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the idle store to hear n1's end", func() bool {
		_, live, _ := idle.Known("n1")
		return !live
	})
	testenv.WaitFor(t, "the idle store to let n1 go", func() bool { return len(idle.Following()) == 0 })
	idle.mu.Lock()
	live, known = len(idle.live), len(idle.known)
	idle.mu.Unlock()
	if live != 0 {
		t.Errorf("the idle store holds %d leases after letting its names go", live)
	}
	_ = known // an ended lease is remembered for knownKeep, to answer by id
}

// TestRestartedDaemonRecordsItsPredecessorsExpiries: a daemon that starts
// follows the token leases its predecessor of the same identity left on
// its buckets (found by the daemon keys, not by reading the prefix), and
// records the expiry of one that nobody renews (docs/PROTOCOL.md §8a,
// "Expiry is the cluster's").
func TestRestartedDaemonRecordsItsPredecessorsExpiries(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	opts := Options{Options: leasecore.Options{LeaseDuration: 2 * time.Second}, DaemonID: "/var/lib/leasefs-a"}
	first, err := Open(ctx, []string{srv.Endpoint()}, "/restart", opts)
	if err != nil {
		t.Fatal(err)
	}
	g, err := first.Reserve(ctx, leasecore.Draft{Resource: "left", HolderUID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the bucket's daemon key", func() bool {
		resp, err := first.cli.Get(ctx, first.k.daemon(first.opts.Host, opts.DaemonID), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count >= 1
	})
	first.Close()
	next, err := Open(ctx, []string{srv.Endpoint()}, "/restart", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if got := next.Following(); len(got) != 1 || got[0] != "left" {
		t.Fatalf("the next daemon follows %v; want [left], its predecessor's token lease", got)
	}
	testenv.WaitFor(t, "the expired lease's history record", func() bool {
		h, err := next.History(ctx, "left")
		return err == nil && len(h) == 1 && h[0].ID == g.Lease.ID && h[0].Status == leasecore.StatusAbandoned
	})
}
