package etcdstore

import (
	"context"
	"testing"
	"time"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/leasecore"
)

// TestCompactionPastANameReadsItAgain: a name's watch that etcd compacted
// past reads the name again, takes what it read as its view and reports
// the end it missed (docs/PROTOCOL.md §8a, "Changes from other mounts").
func TestCompactionPastANameReadsItAgain(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	opts := Options{Options: leasecore.Options{LeaseDuration: time.Hour}}
	other, s := openStore(t, srv, "/compact", opts), openStore(t, srv, "/compact", opts)
	first, err := other.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	firstRec, err := other.getLive(ctx, "x")
	if err != nil || firstRec == nil {
		t.Fatalf("read x: %v, %v", firstRec, err)
	}
	at := int64(first.Lease.Generation)
	if _, err := other.End(ctx, first.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	second, err := other.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.cli.Compact(ctx, int64(second.Lease.Generation)); err != nil {
		t.Fatal(err)
	}
	ends := s.Watch(ctx, leasecore.EventEnded)
	// s follows x as of the first lease's reservation, now compacted.
	s.mu.Lock()
	s.observe("x", at, firstRec, nil)
	s.mu.Unlock()
	testenv.WaitFor(t, "the store's view of x to show the second lease", func() bool {
		l, live, _ := s.Known("x")
		return live && l.ID == second.Lease.ID
	})
	select {
	case e := <-ends:
		if e.Lease.ID != first.Lease.ID {
			t.Errorf("ended event of %s; want the missed end of %s", e.Lease.ID, first.Lease.ID)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("no ended event for the first lease, whose end the compacted watch missed")
	}
}
